"""The real model on the CPU in float32 and in bfloat16, with eager and with fused attention.

For each of the four, in one process: a one-question `embed()` as a search runs it, p50 and
p99 over the LongMemEval questions (the first five untimed), and the time a 5-message window
of a LongMemEval conversation takes when windows are embedded 8 at a time, as the service
batches them on the CPU; and how close each variant's vectors are to float32 eager's, the
reference (the lowest cosine over the questions and over the windows). bfloat16 is fast only
where the CPU multiplies it in hardware (AVX512-BF16 or AMX); the results say whether this one
does, and `EMBED_DTYPE=auto` picks it only there.

Writes results/cpu-dtype-<machine>.json and .png.

Usage:
  python benchmarks/embed/cpu_dtype.py --machine "2-core AMD EPYC (Zen 5)"
"""

from __future__ import annotations

import gzip
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from first_calls import QUESTIONS, REPO, arguments, question_tokens, save

from api_service.core.chunking import window_texts
from embed_service.assembly import ensure_model_folder
from embed_service.model import TransformerEmbedder, cpu_bfloat16_speedup, native_cpu_bfloat16

CONVERSATIONS = QUESTIONS.parent / "oracle.conversations.jsonl.gz"
BATCH = 8  # the CPU's batch_max_texts is 16; 8 windows of 384 tokens fill its token budget
VARIANTS = [
    ("float32", torch.float32, False),
    ("float32, fused", torch.float32, True),
    ("bfloat16", torch.bfloat16, False),
    ("bfloat16, fused", torch.bfloat16, True),
]


def windows(path: Path, count: int) -> list[str]:
    """The first `count` windows of the conversations, as the service builds them."""
    out: list[str] = []
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            messages = json.loads(line)["messages"]
            out += window_texts([(m["role"], m["content"]) for m in messages])
            if len(out) >= count:
                return out[:count]
    return out


def measure(
    model: TransformerEmbedder, questions: list[Any], texts: list[str]
) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    for ids in questions[:5]:
        model.embed([ids])
    times, question_vectors = [], []
    for ids in questions:
        start = time.perf_counter()
        question_vectors.append(model.embed([ids])[0])
        times.append((time.perf_counter() - start) * 1e3)
    tokens = model.tokenize(texts)
    start = time.perf_counter()
    window_vectors = np.vstack(
        [model.embed(tokens[i : i + BATCH]) for i in range(0, len(tokens), BATCH)]
    )
    window_ms = (time.perf_counter() - start) * 1e3 / len(texts)
    figures = {
        "question_p50_ms": statistics.median(times),
        "question_p99_ms": float(np.percentile(times, 99)),
        "window_ms": window_ms,
    }
    return figures, np.array(question_vectors), window_vectors


def draw(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["variants"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    p50 = [results["variants"][n]["question_p50_ms"] for n in names]
    p99 = [results["variants"][n]["question_p99_ms"] for n in names]
    x = np.arange(len(names))
    left.bar(x - 0.2, p50, 0.4, label="p50")
    left.bar(x + 0.2, p99, 0.4, label="p99")
    left.set_xticks(x, names, fontsize=8)
    left.set_ylabel("ms")
    left.set_title("one question's embed()")
    left.legend()
    right.bar(x, [results["variants"][n]["window_ms"] for n in names], color="C2")
    right.set_xticks(x, names, fontsize=8)
    right.set_ylabel("ms a window")
    right.set_title(f"5-message windows, {BATCH} a batch")
    native = "has" if results["native_bfloat16"] else "lacks"
    fig.suptitle(
        f"all-mpnet-base-v2 on the CPU, {results['machine']} ({native} bfloat16 in hardware, "
        f"{results['threads']} threads)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument(
        "--conversations",
        type=Path,
        default=CONVERSATIONS,
        help="LongMemEval conversations (.jsonl.gz) the windows come from",
    )
    parser.add_argument("--count", type=int, default=100, help="questions timed")
    parser.add_argument("--windows", type=int, default=48, help="windows embedded")
    args = parser.parse_args()
    folder = args.model_dir or ensure_model_folder(REPO / "var" / "models")
    texts = windows(args.conversations, args.windows)
    results: dict[str, Any] = {
        "machine": args.machine,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "native_bfloat16": native_cpu_bfloat16(),
        "bfloat16_speedup": cpu_bfloat16_speedup(),
        "questions": args.count,
        "windows": len(texts),
        "variants": {},
    }
    reference: tuple[np.ndarray, np.ndarray] | None = None
    for name, dtype, fused in VARIANTS:
        model = TransformerEmbedder(folder, "cpu", fused_attention=fused, dtype=dtype)
        questions = question_tokens(args, model)[: args.count]
        figures, question_vectors, window_vectors = measure(model, questions, texts)
        reference = reference or (question_vectors, window_vectors)
        figures["min_cosine_questions"] = float((question_vectors * reference[0]).sum(1).min())
        figures["min_cosine_windows"] = float((window_vectors * reference[1]).sum(1).min())
        results["variants"][name] = figures
        print(f"{name}: " + ", ".join(f"{k} {v:.5g}" for k, v in figures.items()), flush=True)
    save(results, args, "cpu-dtype", draw)


if __name__ == "__main__":
    main()
