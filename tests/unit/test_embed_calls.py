"""The indexer's embedding calls: split once when one runs past its deadline, and back to
the full batch once calls fit again (a fake embedder at the client's port; no model involved)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import numpy as np
import pytest

from api_service import indexer


class Overloadable:
    """Answers one-text calls always, longer ones only while not `overloaded`."""

    def __init__(self) -> None:
        self.overloaded = True
        self.calls: list[int] = []  # the texts of every call, answered or not
        self.sizes: list[int] = []  # those of the calls answered

    async def embed(self, texts: Sequence[str], timeout: float | None = None) -> np.ndarray:
        self.calls.append(len(texts))
        if self.overloaded and len(texts) > 1:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata()
            )
        self.sizes.append(len(texts))
        return np.ones((len(texts), 4), dtype=np.float32)


async def test_the_batch_size_a_deadline_cut_grows_back() -> None:
    embedder = Overloadable()
    worker = indexer.Indexer(None, embedder, None, batch_size=8)  # type: ignore[arg-type]
    texts = [f"window {i}" for i in range(8)]

    # Each embedding splits a call past its deadline once; a half past it too fails the
    # embedding (its job is retried), and the next one starts from that half's size.
    for size in (8, 4):
        with pytest.raises(grpc.aio.AioRpcError):
            await worker._embed(texts)
        assert embedder.calls == [size, size // 2]
        embedder.calls = []
    assert (await worker._embed(texts)).shape == (8, 4)  # each call of 2 split into 1 and 1
    assert embedder.calls == [2, 1, 1] * 4 and embedder.sizes == [1] * 8

    embedder.overloaded, embedder.sizes = False, []
    sizes = []
    for _ in range(3 * indexer.GROW_AFTER_CALLS + 1):
        assert (await worker._embed(texts)).shape == (8, 4)
        sizes.append(embedder.sizes[-1])
        embedder.sizes = []
    # GROW_AFTER_CALLS embeddings at each size, then twice the size: 1, 2, 4, back to 8.
    grown = [1] * indexer.GROW_AFTER_CALLS + [2] * indexer.GROW_AFTER_CALLS
    assert sizes == [*grown, *[4] * indexer.GROW_AFTER_CALLS, 8]
