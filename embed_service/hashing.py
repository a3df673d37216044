"""A small deterministic embedder for tests that are not about the model.

Feature hashing of lowercased word tokens with a sign hash, then L2 normalization: texts that
share words have a positive inner product, unrelated texts score near zero. blake2b keeps the
vectors identical across processes (Python's hash() is salted per process).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence

import numpy as np

from embed_service.embedder import TokenIds, Vectors

_WORD = re.compile(r"\w+")
# A text without words still gets a unit vector, the same one every time.
_EMPTY_WORD = "\x00empty"


def _hashed_feature(word: str, dim: int) -> int:
    """Signed feature id: +/-(bucket + 1), so that bucket 0 keeps its sign."""
    digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    bucket = (value >> 1) % dim
    return bucket + 1 if value & 1 else -(bucket + 1)


_cached_feature = functools.lru_cache(maxsize=1 << 18)(_hashed_feature)


def _feature(word: str, dim: int) -> int:
    # Words repeat, and hashing each was most of this embedder's time; long tokens (encoded
    # blobs) rarely repeat and would fill the cache's memory.
    return _cached_feature(word, dim) if len(word) <= 64 else _hashed_feature(word, dim)


class HashingEmbedder:
    """Feature-hashing embedder with the same interface as the transformer model."""

    def __init__(self, dim: int = 768, max_tokens: int = 384) -> None:
        self._dim = dim
        self._max_tokens = max_tokens

    @property
    def name(self) -> str:
        """Model identifier returned to clients."""
        return f"hashing-{self._dim}"

    @property
    def dim(self) -> int:
        """Vector dimension."""
        return self._dim

    @property
    def device(self) -> str:
        """Always the CPU."""
        return "cpu"

    def tokenize(self, texts: Sequence[str]) -> list[TokenIds]:
        """Signed feature ids of each text's lowercased words, truncated like the model."""
        out = []
        for text in texts:
            words = _WORD.findall(text.lower())[: self._max_tokens] or [_EMPTY_WORD]
            out.append(np.array([_feature(w, self._dim) for w in words], dtype=np.int64))
        return out

    def embed(self, batch: Sequence[TokenIds]) -> Vectors:
        """Sum the signed one-hot features of each text and L2-normalize."""
        vectors = np.zeros((len(batch), self._dim), dtype=np.float32)
        for row, ids in enumerate(batch):
            vectors[row] = np.bincount(np.abs(ids) - 1, weights=np.sign(ids), minlength=self._dim)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        # Words can cancel out in one bucket pair; fall back to the empty-text vector then.
        fallback = _feature(_EMPTY_WORD, self._dim)
        for empty in np.flatnonzero(norms[:, 0] == 0):
            vectors[empty, abs(fallback) - 1] = 1.0 if fallback > 0 else -1.0
            norms[empty, 0] = 1.0
        normalized: Vectors = vectors / norms
        return normalized
