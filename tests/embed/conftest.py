"""Fixtures of the embed tests: the real model, loaded once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from embed_service.backends import load_embedder
from embed_service.model import TransformerEmbedder
from embed_service.settings import EmbedSettings

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def model_settings() -> EmbedSettings:
    """Settings of the real model on the CPU in float32, the reference precision, whatever the
    CPU; the assembled folder is cached under var/."""
    return EmbedSettings(
        backend="transformer",
        device="cpu",
        dtype="float32",
        model_cache_dir=REPO_ROOT / "var" / "models",
        port=0,
    )


@pytest.fixture(scope="session")
def real_model(model_settings: EmbedSettings) -> TransformerEmbedder:
    """all-mpnet-base-v2, assembled on first use and loaded once for the whole session."""
    embedder = load_embedder(model_settings)
    assert isinstance(embedder, TransformerEmbedder)
    return embedder
