"""Small batches replayed from CUDA graphs, captured once per (texts, tokens) bucket.

On a GPU a small batch's forward pass is bound by launching its kernels (about 150 for the
12 layers), not by their work: one question took 3.40 ms eagerly and 0.71 ms replayed from a
graph on an H200 (benchmarks/embed/cuda_graphs.py). The embedder captures the fused encoder,
mean pooling and normalization when it loads, one graph per bucket, and runs a batch that fits
through the smallest bucket that holds it:
- padded tokens carry the pad id and are masked out of attention and pooling, as in an eager
  batch, so the vectors are the eager ones to the dtype's rounding;
- padding rows hold one real token (a row with every token masked adds the dtype's lowest
  value to every score, which can overflow) and their vectors are dropped.

The graphs share one memory pool, so a graph's output may lie in memory another graph uses
as scratch: one lock holds a replay from the copy in to the copy of its output back to the
host, and a replay's output is read only under it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np
import torch

from embed_service import mpnet_sdpa
from embed_service.embedder import Vectors
from embed_service.model import pooled_unit_vectors

log = logging.getLogger(__name__)

ROWS = (1, 2, 4, 8, 16)
TOKENS = (16, 32, 64, 128, 256, 384)


def bucket_for(rows: int, tokens: int) -> tuple[int, int] | None:
    """The smallest (rows, tokens) bucket that holds a batch, or None when none does."""
    fit_rows = next((n for n in ROWS if n >= rows), None)
    fit_tokens = next((n for n in TOKENS if n >= tokens), None)
    if fit_rows is None or fit_tokens is None:
        return None
    return fit_rows, fit_tokens


def fill_bucket(
    bucket_ids: np.ndarray, bucket_mask: np.ndarray, ids: np.ndarray, mask: np.ndarray, pad_id: int
) -> None:
    """Write a padded batch into a bucket's larger buffers, over whatever an earlier batch
    left there: pad tokens masked out past the batch's own, one real token in each padding
    row."""
    rows, tokens = ids.shape
    bucket_ids.fill(pad_id)
    bucket_ids[:rows, :tokens] = ids
    bucket_mask.fill(0)
    bucket_mask[:rows, :tokens] = mask
    bucket_mask[rows:, 0] = 1


class _Graph:
    """One captured forward pass. Every tensor it reads or writes outside its own pool is held
    here for as long as the graph lives: static inputs on the host (pinned) and on the GPU,
    the position bias, the output."""

    def __init__(
        self, model: Any, shape: tuple[int, int], pad_id: int, pool: Any, stream: Any
    ) -> None:
        device = next(model.parameters()).device
        self._pad_id = pad_id
        self._host_ids = torch.empty(shape, dtype=torch.long).pin_memory()
        self._host_mask = torch.empty(shape, dtype=torch.long).pin_memory()
        self._ids = torch.full(shape, pad_id, dtype=torch.long, device=device)
        self._mask = torch.ones(shape, dtype=torch.long, device=device)
        with torch.inference_mode():
            # Made outside the graph (some transformers releases build it on the CPU), and kept:
            # the graph reads it at its address, which must not go back to the allocator.
            self._bias = mpnet_sdpa.position_bias_for(
                model, model.embeddings(input_ids=self._ids[:1])
            )

        def forward() -> torch.Tensor:
            hidden = mpnet_sdpa.encode(model, self._ids, self._mask, self._bias)
            return pooled_unit_vectors(hidden, self._mask)

        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.inference_mode(), torch.cuda.stream(stream):
            for _ in range(3):  # kernels pick their algorithms before, not during, the capture
                forward()
        torch.cuda.current_stream(device).wait_stream(stream)
        self._graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self._graph, pool=pool, stream=stream):
            self._out = forward()

    def run(self, ids: np.ndarray, mask: np.ndarray) -> Vectors:
        """Vectors of a padded batch no larger than this graph's shape. The caller holds the
        lock: the copy of the output back to the host waits for the replay, and so also for
        the copies in, after which the pinned buffers may be written again."""
        fill_bucket(self._host_ids.numpy(), self._host_mask.numpy(), ids, mask, self._pad_id)
        self._ids.copy_(self._host_ids, non_blocking=True)
        self._mask.copy_(self._host_mask, non_blocking=True)
        self._graph.replay()
        vectors: Vectors = self._out[: ids.shape[0]].cpu().numpy()
        return vectors


class CudaGraphs:
    """A graph per bucket of ROWS x TOKENS for `model` (an MPNetModel on a CUDA device)."""

    def __init__(self, model: Any, pad_id: int) -> None:
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        # One stream for every warm-up and capture: cuBLAS keeps a workspace per stream.
        stream = torch.cuda.Stream(next(model.parameters()).device)  # type: ignore[no-untyped-call]
        # Largest first: the pool grows to the largest graph's needs once.
        shapes = sorted(((r, t) for r in ROWS for t in TOKENS), reverse=True)
        self._graphs = {shape: _Graph(model, shape, pad_id, pool, stream) for shape in shapes}
        self._lock = threading.Lock()
        log.info(
            "captured %d CUDA graphs (up to %d texts of %d tokens) in %.1f s",
            len(self._graphs),
            ROWS[-1],
            TOKENS[-1],
            time.perf_counter() - started,
        )

    def embed(self, ids: np.ndarray, mask: np.ndarray) -> Vectors | None:
        """Vectors of a padded batch (ids and attention mask, int64), or None when no bucket
        holds it."""
        shape = bucket_for(*ids.shape)
        if shape is None:
            return None
        with self._lock:
            return self._graphs[shape].run(ids, mask)
