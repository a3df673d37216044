"""Decoding and checking vectors from the wire (little-endian float32)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from index_service.errors import InvalidArgument

Matrix = NDArray[np.float32]
Labels = NDArray[np.int64]

_LE_F32 = np.dtype("<f4")


def decode(blobs: list[bytes], dim: int) -> Matrix:
    """Stack `blobs` (each `dim` little-endian float32 values) into unit-norm rows.

    Raises InvalidArgument for a wrong length, a non-finite value or an all-zero vector.
    """
    for position, blob in enumerate(blobs):
        if len(blob) != dim * 4:
            raise InvalidArgument(
                f"vector {position} has {len(blob)} bytes; expected {dim * 4} ({dim} float32)"
            )
    if not blobs:
        return np.empty((0, dim), dtype=np.float32)
    matrix = np.frombuffer(b"".join(blobs), dtype=_LE_F32).reshape(len(blobs), dim)
    return normalize(matrix.astype(np.float32))


def normalize(matrix: NDArray[np.floating], *, check: bool = True) -> Matrix:
    """Rows scaled to unit L2 norm, so inner product is cosine similarity."""
    rows = np.ascontiguousarray(matrix, dtype=np.float32)
    if check and not np.isfinite(rows).all():
        bad = int(np.argwhere(~np.isfinite(rows).all(axis=1))[0][0])
        raise InvalidArgument(f"vector {bad} has a non-finite value")
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    if check and (norms == 0).any():
        raise InvalidArgument(f"vector {int(np.argwhere(norms[:, 0] == 0)[0][0])} is all zeros")
    out: Matrix = rows / np.maximum(norms, np.float32(1e-30))
    return out
