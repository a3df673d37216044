"""The first call of each new batch shape on a GPU, with cuDNN's attention allowed and left out.

A service embeds batches of every (texts, tokens) shape its callers send: one question of 17
tokens, then one of 23, then 3 texts of 40. cuDNN's attention builds a plan at the first call
of each shape, and the model (embed_service.model) turns it off on CUDA for that reason. This
times, on the fused encoder (embed_service.mpnet_sdpa), the first and the second forward pass
of shapes not seen before in the process: one text at each length of a range, then 2-12
texts at one length, first with cuDNN's attention left out, then on the same shapes with it
allowed (that run finds the other kernels loaded, so what it adds is cuDNN's own). Then it
times a one-question `embed()` as the service runs it, p50 and p99 over the LongMemEval
questions, each length's first call included.

Needs a CUDA device (`--device cpu` runs it only to check it) and the model folder
(--model-dir, or the one assembled from the PyPI parts). Writes
results/first-calls-<machine>.json and .png.

Usage:
  python benchmarks/embed/first_calls.py --machine "NVIDIA H200"
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embed_service import mpnet_sdpa
from embed_service.assembly import ensure_model_folder
from embed_service.embedder import TokenIds
from embed_service.model import TransformerEmbedder

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
QUESTIONS = REPO.parent / "shared" / "data" / "longmemeval" / "s150.questions.jsonl"


def ms(fn: Callable[..., Any], *args: Any) -> float:
    """Wall time of fn(*args), the GPU's work included."""
    start = time.perf_counter()
    fn(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def forward(model: TransformerEmbedder, texts: int, length: int) -> None:
    ids = torch.ones((texts, length), dtype=torch.long, device=model.device)
    mask = torch.ones_like(ids)
    mask[:, length // 2 :] = 0  # half padding, as a batch of uneven texts has
    with torch.inference_mode():
        mpnet_sdpa.encode(model.model, ids, mask)


def new_shapes(
    model: TransformerEmbedder, lengths: range, rows: range, row_length: int
) -> dict[str, list[float]]:
    """First and second call of one text at each length, then of each row count."""
    out: dict[str, list[float]] = {"first": [], "second": [], "rows_first": [], "rows_second": []}
    for length in lengths:
        out["first"].append(ms(forward, model, 1, length))
        out["second"].append(ms(forward, model, 1, length))
    for count in rows:
        out["rows_first"].append(ms(forward, model, count, row_length))
        out["rows_second"].append(ms(forward, model, count, row_length))
    return out


def arguments(doc: str) -> argparse.ArgumentParser:
    """The arguments every model benchmark here takes; its help is the script's docstring
    (`doc`): the first paragraph, then what follows "Usage:"."""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        epilog=doc.split("Usage:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--machine", required=True, help="names the result files")
    parser.add_argument("--model-dir", type=Path, help="a ready model folder")
    parser.add_argument(
        "--questions", type=Path, default=QUESTIONS, help="LongMemEval questions (.jsonl)"
    )
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    return parser


def setup(doc: str) -> tuple[argparse.Namespace, Path, dict[str, Any]]:
    """The arguments this script and cuda_graphs.py take (`doc`: the script's docstring), the
    model folder, and the results' opening fields."""
    parser = arguments(doc)
    parser.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda", help="cpu only checks the script"
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("needs a CUDA device (--device cpu only checks the script)")
    folder = args.model_dir or ensure_model_folder(REPO / "var" / "models")
    results = {"machine": args.machine, "device": args.device, "torch": torch.__version__}
    return args, folder, results


def question_tokens(args: argparse.Namespace, model: TransformerEmbedder) -> list[TokenIds]:
    """Each LongMemEval question's token ids, in file order."""
    lines = args.questions.read_text().splitlines()
    return [model.tokenize([json.loads(line)["question"]])[0] for line in lines]


def save(
    results: dict[str, Any],
    args: argparse.Namespace,
    name: str,
    draw: Callable[[dict[str, Any], Path], None],
) -> None:
    """results/<name>-<machine>.json, and the plot `draw` makes of them beside it."""
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{name}-{re.sub(r'[^a-z0-9]+', '-', args.machine.lower()).strip('-')}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    draw(results, stem.with_suffix(".png"))
    print(f"wrote {stem}.json and .png")


def main() -> None:
    args, folder, results = setup(__doc__)
    # Without CUDA graphs, whose capture would load the kernels before the first calls timed
    # here; the service replays small batches from graphs (cuda_graphs.py times those).
    model = TransformerEmbedder(folder, device=args.device, cuda_graphs=False)
    forward(model, 1, 8)  # the process's first call: CUDA's own start-up, not a shape's
    lengths, rows, row_length = range(100, 116), range(2, 13), 48
    results.update(lengths=list(lengths), rows=list(rows), row_length=row_length)
    # cuDNN's attention left out first: its run meets every shape cold. The run that allows it
    # then finds the matrix products' kernels loaded, so what it adds is cuDNN's own.
    for name, allowed in (("cudnn_left_out", False), ("cudnn_allowed", True)):
        torch.backends.cuda.enable_cudnn_sdp(allowed)
        results[name] = new_shapes(model, lengths, rows, row_length)
        first = results[name]["first"] + results[name]["rows_first"]
        print(f"{name}: first call of a new shape p50 {statistics.median(first):.1f} ms")
    torch.backends.cuda.enable_cudnn_sdp(False)

    tokens = question_tokens(args, model)[:200]
    times = [ms(model.embed, [t]) for t in tokens]
    results["embed_one_question_ms"] = {
        "p50": statistics.median(times),
        "p99": float(np.percentile(times, 99)),
        "questions": len(times),
    }
    print(f"embed() of one question, cold lengths included: {results['embed_one_question_ms']}")

    save(results, args, "first-calls", plot)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, color in (("cudnn_allowed", "tab:red"), ("cudnn_left_out", "tab:blue")):
        for ax, key, xs in ((axes[0], "", "lengths"), (axes[1], "rows_", "rows")):
            runs = results[name]
            ax.plot(results[xs], runs[f"{key}first"], "o-", color=color, label=f"{name}, first")
            ax.plot(results[xs], runs[f"{key}second"], "x:", color=color, label=f"{name}, second")
    axes[0].set(title="one text of each length", xlabel="tokens", ylabel="forward pass, ms")
    axes[1].set(title=f"n texts of {results['row_length']} tokens (half padding)", xlabel="texts")
    for ax in axes:
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.suptitle(f"first forward pass of a new shape, {results['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
