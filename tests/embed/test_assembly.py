"""Model assembly from split zip pieces, on a tiny stand-in archive."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from embed_service import assembly


def _split_zip(tmp_path: Path, weights: bytes) -> list[Path]:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{assembly.MODEL_NAME}/{assembly.WEIGHTS_FILE}", weights)
        archive.writestr(f"{assembly.MODEL_NAME}/config.json", "{}")
    data = buffer.getvalue()
    step = len(data) // 5 + 1
    pieces = []
    for n in range(5):
        piece = tmp_path / f"model.zip.{n + 1:03d}"
        piece.write_bytes(data[n * step : (n + 1) * step])
        pieces.append(piece)
    return pieces


def test_assembles_verifies_and_reuses_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = b"stand-in weights"
    pieces = _split_zip(tmp_path, weights)
    monkeypatch.setattr(assembly, "part_files", lambda: pieces)
    monkeypatch.setattr(assembly, "WEIGHTS_SHA256", hashlib.sha256(weights).hexdigest())
    folder = assembly.ensure_model_folder(tmp_path / "cache")
    assert (folder / assembly.WEIGHTS_FILE).read_bytes() == weights
    assert (folder / "config.json").read_text() == "{}"

    def no_parts() -> list[Path]:
        raise AssertionError("a verified cache must not be assembled again")

    monkeypatch.setattr(assembly, "part_files", no_parts)
    assert assembly.ensure_model_folder(tmp_path / "cache") == folder


def test_wrong_checksum_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pieces = _split_zip(tmp_path, b"tampered weights")
    monkeypatch.setattr(assembly, "part_files", lambda: pieces)
    with pytest.raises(assembly.ModelAssemblyError, match="sha256"):
        assembly.ensure_model_folder(tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_installed_parts_are_found_in_order() -> None:
    names = [p.name for p in assembly.part_files()]
    assert names == [f"all-mpnet-base-v2.zip.{n:03d}" for n in range(1, 6)]
