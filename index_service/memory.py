"""Returning freed memory to the operating system."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)  # glibc only
    return trim


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them otherwise).

    Loads and rebuilds allocate transient copies of an org's vectors, gigabytes for a large
    org; without this the shard's resident size stays at its peak.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
