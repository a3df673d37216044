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
    with np.errstate(over="ignore", under="ignore"):  # such rows are measured again below
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
    extreme = ~((norms[:, 0] > TINY) & (norms[:, 0] < HUGE))
    if extreme.any():
        # Squared in float32, components near its limits (1e20, 1e-25) overflow to infinity
        # or vanish: such rows are first divided by their largest component (a copy of them
        # alone; a rebuild's block holds thousands of rows).
        odd = rows[extreme]
        peak = np.abs(odd).max(axis=1, keepdims=True)
        odd /= np.where(peak > 0, peak, np.float32(1))
        norms[extreme] = np.linalg.norm(odd, axis=1, keepdims=True)
    if check and (norms == 0).any():
        raise InvalidArgument(f"vector {int(np.argwhere(norms[:, 0] == 0)[0][0])} is all zeros")
    norms[norms == 0] = 1  # an all-zero row, unchecked, stays as it is
    out: Matrix = rows / norms  # the extreme rows are replaced below, scaled
    if extreme.any():
        out[extreme] = odd / norms[extreme]
    return out


# Outside these, a row's norm may have overflowed or underflowed when squared in float32.
HUGE = np.float32(1e18)
TINY = np.float32(1e-18)
