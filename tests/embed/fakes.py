"""A controllable fake model for batcher tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np

from embed_service.embedder import TokenIds, Vectors

POISON = "!"


class FakeEmbedder:
    """Token ids are the text's character codes; a vector is [length, first code, 0, 0].

    `gate` closed makes `embed` block until the test opens it; `entered` is set (on the event
    loop) each time a batch reaches the model. A batch holding a text of `held` then blocks
    until `release` is set, so one batch can stay with the model while others pass. A text
    containing "!" makes its batch fail.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.gate = threading.Event()
        self.gate.set()
        self.held: frozenset[str] = frozenset()
        self.release = threading.Event()
        self.release.set()
        self.entered = asyncio.Event()
        self.batches: list[list[str]] = []

    @property
    def name(self) -> str:
        return "fake"

    @property
    def dim(self) -> int:
        return 4

    @property
    def device(self) -> str:
        return "cpu"

    def tokenize(self, texts: Sequence[str]) -> list[TokenIds]:
        return [np.array([ord(c) for c in text], dtype=np.int64) for text in texts]

    def embed(self, batch: Sequence[TokenIds]) -> Vectors:
        texts = ["".join(chr(c) for c in ids) for ids in batch]
        self.batches.append(texts)
        self._loop.call_soon_threadsafe(self.entered.set)
        self.gate.wait()
        if self.held.intersection(texts):
            self.release.wait()
        if any(POISON in t for t in texts):
            raise RuntimeError("poisoned batch")
        out = np.zeros((len(batch), 4), dtype=np.float32)
        for row, ids in enumerate(batch):
            out[row, 0] = len(ids)
            out[row, 1] = ids[0] if len(ids) else 0
        return out

    def seen(self) -> list[str]:
        """Every text the model was given, in order."""
        return [t for batch in self.batches for t in batch]
