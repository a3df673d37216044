"""Vectors from the wire and from PostgreSQL scaled to unit length."""

from __future__ import annotations

import numpy as np
import pytest

from index_service.errors import InvalidArgument
from index_service.vectors import normalize


def test_rows_near_float32_limits_beside_ordinary_ones() -> None:
    rows = np.array(
        [
            [1e20, -1e-30, 3.0, 0.0],  # a huge component beside tiny ones
            [3e38, 3e38, -3e38, 0.0],  # squares far past float32's largest
            [1e-40, 0.0, -1e-40, 0.0],  # subnormal: squares that vanish
            [1.0, 2.0, 2.0, 0.0],
        ],
        np.float32,
    )
    given = rows.copy()
    out = normalize(rows)
    expected = given.astype(np.float64)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(out, expected, atol=1e-6)
    assert out.dtype == np.float32
    assert (rows == given).all()  # the caller's rows are left as they were


def test_a_rebuild_block_keeps_an_all_zero_row_as_zeros_and_a_check_refuses_it() -> None:
    rows = np.array([[0.0, 0.0], [1e-45, 0.0], [0.0, 4.0]], np.float32)
    np.testing.assert_array_equal(normalize(rows, check=False), [[0, 0], [1, 0], [0, 1]])
    with pytest.raises(InvalidArgument, match="vector 0 is all zeros"):
        normalize(rows)
