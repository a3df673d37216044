"""Small batches on a GPU: the eager forward against the service's CUDA graphs.

A search embeds one short question, and a lightly loaded service embeds a few texts at a time.
On a GPU such a forward pass is bound by launching its kernels (about 150, 12 layers), not by
their work; the service captures graphs of small batches when it loads
(embed_service.cuda_graphs) and replays them. This loads the model twice, as the service
does (graphs) and with `cuda_graphs=False` (eager), and times `embed()` in both:
- one LongMemEval question at a time, warm (every length met once before);
- batches of 1-32 texts of 32, 128 and 384 tokens (32 texts lie past the graphs: eager in both).
It also reports how long the graphs take to capture, the GPU memory they hold, and the lowest
cosine of a replayed vector to the eager one.

Needs a CUDA device (`--device cpu` times the eager path only, to check the script) and the
model folder (--model-dir, or the one assembled from the PyPI parts). Writes
results/cuda-graphs-<machine>.json and .png.

Usage:
  python benchmarks/embed/cuda_graphs.py --machine "NVIDIA H200"
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from first_calls import question_tokens, save, setup

from embed_service.cuda_graphs import CudaGraphs
from embed_service.embedder import TokenIds
from embed_service.model import TransformerEmbedder

ROWS = (1, 2, 4, 8, 16, 32)
TOKENS = (32, 128, 384)
CALLS = 30


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start) * 1e3, out


def summary(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": statistics.median(ms), "p99_ms": float(np.percentile(ms, 99))}


def reserved_mb() -> float:
    """GPU memory the allocator holds for live tensors and graphs (its cache emptied first)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved() / 2**20


def capture(model: TransformerEmbedder) -> dict[str, float]:
    """Seconds and GPU memory (MiB) that capturing the service's graphs takes, once more."""
    before = reserved_mb()
    took, graphs = timed(lambda: CudaGraphs(model.model, model.pad_id))
    held = reserved_mb() - before
    del graphs
    return {"capture_s": took / 1e3, "reserved_mib": held}


def one_question(model: TransformerEmbedder, tokens: list[TokenIds]) -> tuple[list[float], Any]:
    for ids in tokens:  # every length once: the timings are warm
        model.embed([ids])
    runs = [timed(lambda ids=ids: model.embed([ids])) for ids in tokens]
    return [ms for ms, _ in runs], np.concatenate([vector for _, vector in runs])


def batch_grid(model: TransformerEmbedder) -> dict[str, float]:
    """p50 ms of embed() per 'texts x tokens' batch of random ids (full length, no padding)."""
    rng = np.random.default_rng(0)
    out = {}
    for rows in ROWS:
        for tokens in TOKENS:
            batch = [rng.integers(1000, 30000, tokens) for _ in range(rows)]
            for _ in range(3):
                model.embed(batch)
            out[f"{rows}x{tokens}"] = statistics.median(
                timed(lambda b=batch: model.embed(b))[0] for _ in range(CALLS)
            )
    return out


def main() -> None:
    args, folder, results = setup(__doc__)
    eager = TransformerEmbedder(folder, device=args.device, cuda_graphs=False)
    tokens = question_tokens(args, eager)
    eager_ms, eager_vectors = one_question(eager, tokens)
    results.update(
        questions=len(tokens),
        tokens_max=max(len(t) for t in tokens),
        eager=summary(eager_ms),
        eager_batches=batch_grid(eager),
        eager_ms=eager_ms,
    )
    print(f"eager embed(), one question: {results['eager']}")
    if args.device == "cuda":
        results["graphs"] = capture(eager)
        graphed = TransformerEmbedder(folder, device=args.device)
        graph_ms, graph_vectors = one_question(graphed, tokens)
        cosines = np.sum(eager_vectors * graph_vectors, axis=1)
        results.update(
            graph=summary(graph_ms),
            graph_batches=batch_grid(graphed),
            cosine_to_eager_min=float(cosines.min()),
            graph_ms=graph_ms,
        )
        print(f"graph replay, one question: {results['graph']}")
        print(f"graphs: {results['graphs']['capture_s']:.1f} s to capture, ", end="")
        print(f"{results['graphs']['reserved_mib']:.0f} MiB of GPU memory")
        print(f"cosine of the replayed vectors to the eager ones: min {cosines.min():.6f}")
        for shape, ms in results["eager_batches"].items():
            print(f"{shape:>8}: eager {ms:6.2f} ms, graph {results['graph_batches'][shape]:6.2f}")
    save(results, args, "cuda-graphs", plot)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [name for name in ("eager", "graph") if name in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    for offset, quantile in ((-0.2, "p50_ms"), (0.2, "p99_ms")):
        xs = [i + offset for i in range(len(modes))]
        left.bar(xs, [results[n][quantile] for n in modes], width=0.4, label=quantile[:3])
    left.set_xticks(range(len(modes)), modes)
    left.set(ylabel="ms", title=f"one question, {results['questions']} questions")
    left.legend()
    for mode, style in zip(modes, ("o-", "x--"), strict=False):
        grid = results[f"{mode}_batches"]
        for tokens in TOKENS:
            ms = [grid[f"{rows}x{tokens}"] for rows in ROWS]
            right.plot(ROWS, ms, style, label=f"{mode}, {tokens} tokens")
    right.set(xscale="log", yscale="log", xlabel="texts in the batch", ylabel="ms, p50")
    right.set_xticks(ROWS, [str(r) for r in ROWS])
    right.set_title("a batch's embed()")
    right.legend(fontsize=7)
    fig.suptitle(f"eager forward against CUDA graph replay, {results['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
