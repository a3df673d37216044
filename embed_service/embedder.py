"""The port between the batcher and a model: tokenize on any thread, embed on the model thread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

TokenIds = npt.NDArray[np.int64]
"""One text's token ids, special tokens included and already truncated."""

Vectors = npt.NDArray[np.float32]
"""A (texts, dim) array of L2-normalized rows."""


class Embedder(Protocol):
    """What the batcher needs from a model.

    `tokenize` must be safe to call from several threads at once while `embed` runs;
    `embed` is only ever called from the model threads.
    """

    @property
    def name(self) -> str:
        """Model identifier returned to clients."""
        ...

    @property
    def dim(self) -> int:
        """Vector dimension."""
        ...

    @property
    def device(self) -> str:
        """'cpu' or 'cuda'."""
        ...

    def tokenize(self, texts: Sequence[str]) -> list[TokenIds]:
        """Token ids per text; their lengths drive batching."""
        ...

    def embed(self, batch: Sequence[TokenIds]) -> Vectors:
        """Vectors for a batch of tokenized texts, in the given order."""
        ...
