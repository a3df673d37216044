"""The hashing embedder other packages' tests rely on."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from embed_service.hashing import HashingEmbedder, _hashed_feature


def _embed(texts: list[str]) -> np.ndarray:
    model = HashingEmbedder()
    return model.embed(model.tokenize(texts))


def test_unit_vectors_of_768_dims_even_without_words() -> None:
    vectors = _embed(["Some words here", "", "!!!"])
    assert vectors.shape == (3, 768)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)


def test_shared_words_score_higher_than_unrelated_text() -> None:
    query, related, unrelated = _embed(
        ["Where did I park the car", "I parked the CAR near the station", "quarterly tax forms"]
    )
    assert query @ related > query @ unrelated
    assert query @ related > 0.2


def test_vectors_are_identical_across_processes() -> None:
    code = (
        "from embed_service.hashing import HashingEmbedder as H;m=H();"
        "print(m.embed(m.tokenize(['stable across processes'])).tobytes().hex())"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert bytes.fromhex(other) == _embed(["stable across processes"]).tobytes()


def test_long_texts_keep_their_first_words_whichever_way_they_are_split() -> None:
    model = HashingEmbedder(max_tokens=384)
    short_words = " ".join(f"w{i}" for i in range(2000))  # 384 words fit in the prefix
    long_words = " ".join(f"Longerword{i:05d}" for i in range(2000))  # they do not
    for text in (short_words, long_words):
        expected = [_hashed_feature(w, 768) for w in text.lower().split()[:384]]
        assert model.tokenize([text])[0].tolist() == expected
