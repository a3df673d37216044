"""The real model on the CPU, run on one thread or on a second one beside the loading thread.

Torch runs its CPU kernels on OpenMP, which keeps a team of threads for each thread that
calls it. GNU OpenMP spins its threads between parallel regions while they number no more
than the cores, and puts them to sleep after a few spins once they do; waking them then
costs each of a forward pass's regions. A service that loads the model on one thread and
embeds on another has two teams: on a 2-core machine, four OpenMP threads. Each variant runs
in a process of its own (the model as `EMBED_DTYPE=auto` loads it, with the service's
warm-up) and times a one-question embed() over the LongMemEval questions (p50 and p99, the
first five untimed) and 5-message windows embedded 8 at a time:

- one thread: the model loaded and run on the same thread;
- beside the loader: run on a second thread while the loading thread lives on (the embed
  service until it loaded on a thread that ends);
- after the loader: run on a second thread once the loading thread has ended
  (embed_service.main.load_on_a_thread_that_ends).

Writes results/openmp-teams-<machine>.json and .png.

Usage:
  python benchmarks/embed/openmp_teams.py --machine "2-core Intel Xeon (family 6 model 167)"
"""

from __future__ import annotations

import argparse
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from cpu_dtype import BATCH, CONVERSATIONS, draw, measure, windows
from first_calls import REPO, arguments, question_tokens, save

from embed_service.assembly import ensure_model_folder
from embed_service.backends import load_embedder
from embed_service.model import TransformerEmbedder, native_cpu_bfloat16
from embed_service.settings import EmbedSettings

VARIANTS = ("one thread", "beside the loader", "after the loader")


def run(variant: str, args: argparse.Namespace, texts: list[str]) -> dict[str, float]:
    """The figures of `variant`, measured in this process."""
    settings = EmbedSettings(backend="transformer", device="cpu", model_dir=args.model_dir)

    def load() -> TransformerEmbedder:
        model = load_embedder(settings)
        assert isinstance(model, TransformerEmbedder)
        return model

    def timed(model: TransformerEmbedder) -> dict[str, float]:
        questions = question_tokens(args, model)[: args.count]
        return measure(model, questions, texts)[0]

    if variant == "one thread":
        return timed(load())
    loader = ThreadPoolExecutor(1, "load")
    model = loader.submit(load).result()
    if variant == "after the loader":
        loader.shutdown(wait=True)
    with ThreadPoolExecutor(1, "model") as worker:
        figures = worker.submit(timed, model).result()
        figures["threads_alive"] = float(threading.active_count())
    loader.shutdown(wait=True)
    return figures


def child(variant: str, args: argparse.Namespace, texts: list[str], out: Any) -> None:
    out.send(run(variant, args, texts))


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--count", type=int, default=100, help="questions timed")
    parser.add_argument("--windows", type=int, default=48, help="windows embedded")
    args = parser.parse_args()
    args.model_dir = args.model_dir or ensure_model_folder(REPO / "var" / "models")
    texts = windows(CONVERSATIONS, args.windows)
    results: dict[str, Any] = {
        "machine": args.machine,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "parallel": torch.__config__.parallel_info(),
        "questions": args.count,
        "windows": len(texts),
        "batch": BATCH,
        "native_bfloat16": native_cpu_bfloat16(),
        "variants": {},
    }
    spawn = multiprocessing.get_context("spawn")  # a new process: no OpenMP team yet
    for variant in VARIANTS:
        receive, send = spawn.Pipe(duplex=False)
        process = spawn.Process(target=child, args=(variant, args, texts, send))
        process.start()
        send.close()  # the child's copy is the only one: its end is the pipe's end
        try:
            figures = receive.recv()
        except EOFError:
            process.join()
            exit_code = process.exitcode
            raise SystemExit(f"{variant}: the process measuring it ended ({exit_code})") from None
        process.join()
        results["variants"][variant] = figures
        print(f"{variant}: " + ", ".join(f"{k} {v:.4g}" for k, v in figures.items()), flush=True)
    save(results, args, "openmp-teams", draw)


if __name__ == "__main__":
    main()
