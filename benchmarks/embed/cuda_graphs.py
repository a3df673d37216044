"""One question's embedding on a GPU: the eager forward against a CUDA graph replayed.

A search embeds one short question. On a GPU that forward pass is bound by launching its
kernels (about 150 of them, 12 layers), not by their work: 64 questions take about as long as
one. A CUDA graph captured once per padded length launches them all in one call. This times,
over LongMemEval questions, the model's `embed()` of one question (warm: every length met
once before) against the replay of a graph captured for the smallest bucket that holds the
question (padding is masked out of attention and pooling), and compares the vectors.

Needs a CUDA device for the graphs (`--device cpu` times the eager path only, to check the
script) and the model folder (--model-dir, or the one assembled from the PyPI parts). Writes
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

from embed_service import mpnet_sdpa
from embed_service.model import TransformerEmbedder, pooled_unit_vectors

BUCKETS = (16, 32, 48, 64, 96, 128)


class GraphedQuestion:
    """A CUDA graph of the encoder, mean pooling and normalization for one (1, length) input."""

    def __init__(self, model: TransformerEmbedder, length: int) -> None:
        device = model.device
        self.pad = model.pad_id
        self.ids = torch.full((1, length), model.pad_id, dtype=torch.long, device=device)
        self.mask = torch.zeros((1, length), dtype=torch.long, device=device)
        self.ids[0, 0], self.mask[0, 0] = 0, 1  # a real token for the warm-up runs

        with torch.inference_mode():
            hidden = model.model.embeddings(input_ids=self.ids)
            bias = mpnet_sdpa.position_bias_for(model.model, hidden)

        def run() -> torch.Tensor:
            hidden = mpnet_sdpa.encode(model.model, self.ids, self.mask, bias)
            return pooled_unit_vectors(hidden, self.mask)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(side):
            for _ in range(3):  # warm-up outside the capture, as CUDA graphs require
                run()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph):
            self.out = run()

    def embed(self, ids: list[int]) -> np.ndarray:
        self.ids.fill_(self.pad)
        self.mask.zero_()
        self.ids[0, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        self.mask[0, : len(ids)] = 1
        self.graph.replay()
        result: np.ndarray = self.out.cpu().numpy()
        return result


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start) * 1e3, out


def summary(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": statistics.median(ms), "p99_ms": float(np.percentile(ms, 99))}


def main() -> None:
    args, model, results = setup(__doc__)
    tokens = question_tokens(args, model)
    tokens = [t for t in tokens if len(t) <= BUCKETS[-1]]
    for ids in tokens:  # every length once: the timings below are warm
        model.embed([ids])
    eager = [timed(lambda ids=ids: model.embed([ids])) for ids in tokens]
    eager_ms = [ms for ms, _ in eager]
    eager_vectors = [vector for _, vector in eager]
    results.update(
        questions=len(tokens), tokens_max=max(len(t) for t in tokens), eager=summary(eager_ms)
    )
    print(f"eager embed(), one question: {results['eager']}")
    if args.device == "cuda":
        graphs, capture_ms = {}, {}
        for length in BUCKETS:
            capture_ms[length], graphs[length] = timed(lambda n=length: GraphedQuestion(model, n))
        replay_ms, replay_vectors = [], []
        for ids in tokens:
            bucket = next(n for n in BUCKETS if n >= len(ids))
            took, vector = timed(lambda ids=ids, b=bucket: graphs[b].embed(ids))
            replay_ms.append(took)
            replay_vectors.append(vector)
        cosines = [float(a[0] @ b[0]) for a, b in zip(eager_vectors, replay_vectors, strict=True)]
        results.update(
            buckets=list(BUCKETS),
            capture_ms={str(k): v for k, v in capture_ms.items()},
            graph=summary(replay_ms),
            cosine_to_eager_min=min(cosines),
            eager_ms=eager_ms,
            graph_ms=replay_ms,
        )
        print(f"graph replay, one question: {results['graph']}; capture {capture_ms} ms")
        print(f"cosine of the replayed vectors to the eager ones: min {min(cosines):.6f}")
    save(results, args, "cuda-graphs", plot)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [name for name in ("eager", "graph") if name in results]
    for offset, quantile in ((-0.2, "p50_ms"), (0.2, "p99_ms")):
        xs = [i + offset for i in range(len(names))]
        ax.bar(xs, [results[n][quantile] for n in names], width=0.4, label=quantile[:3])
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("ms, one question")
    ax.set_title(f"one question's embedding, {results['machine']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
