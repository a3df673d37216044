"""A small deterministic embedder for tests that are not about the model.

Feature hashing of lowercased word tokens with a sign hash, then L2 normalization: texts that
share words have a positive inner product, unrelated texts score near zero. blake2b keeps the
vectors identical across processes (Python's hash() is salted per process).
"""

from __future__ import annotations

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


# Words repeat, and hashing each was most of this embedder's time: known words are looked up
# in one pass (a map over a dict, no Python call a word). The memo is bounded, and long tokens
# (encoded blobs) rarely repeat, so they are not kept.
_MEMO_WORDS = 1 << 18
_MEMO_WORD_CHARS = 64
_PREFIX_CHARS_A_WORD = 8


class HashingEmbedder:
    """Feature-hashing embedder with the same interface as the transformer model."""

    def __init__(self, dim: int = 768, max_tokens: int = 384) -> None:
        self._dim = dim
        self._max_tokens = max_tokens
        self._memo: dict[str, int] = {}

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
            words = self._words(text) or [_EMPTY_WORD]
            ids = list(map(self._memo.get, words))
            if None in ids:
                ids = [
                    self._feature(w) if i is None else i for i, w in zip(ids, words, strict=True)
                ]
            out.append(np.array(ids, dtype=np.int64))
        return out

    def _words(self, text: str) -> list[str]:
        """The first max_tokens lowercased words. A long text is split from a prefix first:
        splitting all of it was most of the time left. Only the prefix's last word can be cut
        short, so more than max_tokens words from it are enough."""
        prefix = text[: self._max_tokens * _PREFIX_CHARS_A_WORD]
        words: list[str] = _WORD.findall(prefix.lower())
        if len(words) <= self._max_tokens and len(prefix) < len(text):
            words = _WORD.findall(text.lower())
        return words[: self._max_tokens]

    def _feature(self, word: str) -> int:
        feature = _hashed_feature(word, self._dim)
        if len(word) <= _MEMO_WORD_CHARS and len(self._memo) < _MEMO_WORDS:
            self._memo[word] = feature
        return feature

    def embed(self, batch: Sequence[TokenIds]) -> Vectors:
        """Sum the signed one-hot features of each text and L2-normalize."""
        vectors = np.zeros((len(batch), self._dim), dtype=np.float32)
        for row, ids in enumerate(batch):
            vectors[row] = np.bincount(np.abs(ids) - 1, weights=np.sign(ids), minlength=self._dim)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        # Words can cancel out in one bucket pair; fall back to the empty-text vector then.
        fallback = _hashed_feature(_EMPTY_WORD, self._dim)
        for empty in np.flatnonzero(norms[:, 0] == 0):
            vectors[empty, abs(fallback) - 1] = 1.0 if fallback > 0 else -1.0
            norms[empty, 0] = 1.0
        normalized: Vectors = vectors / norms
        return normalized
