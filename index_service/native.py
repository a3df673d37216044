"""Process-level tuning of native libraries: the C heap and numpy's BLAS threads."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Callable, Iterator
from pathlib import Path


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


def single_threaded_numpy_blas() -> bool:
    """Make numpy's bundled OpenBLAS run each call on one thread; True if it could be set.

    A search is one matrix-vector product. A multi-threaded BLAS call waits for its slowest
    thread, and on a busy machine one of them is often descheduled: measured on 2 cores under
    load, 10k x 768 had p99 28 ms with 2 threads and 5 ms with one. Parallelism comes from
    serving several queries at once instead. FAISS links its own OpenBLAS, so index builds
    keep all cores.
    """
    import numpy as np

    libs = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for path in sorted(libs.glob("libscipy_openblas*.so*")):
        lib = ctypes.CDLL(str(path))
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads"):
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(1)
                return True
    return False


def single_threaded_faiss() -> None:
    """Run this thread's FAISS calls on one OpenMP thread (the setting is per thread).

    Used by the request threads and the shard's event loop: a search or a write of a few
    vectors gains little from splitting, and an OpenMP region waits for all its threads, so a
    busy machine turns every descheduled helper into tail latency. Build threads keep the
    default and use every core.
    """
    import faiss

    faiss.omp_set_num_threads(1)


@contextlib.contextmanager
def faiss_threads(count: int) -> Iterator[None]:
    """This thread's FAISS calls on `count` OpenMP threads for the block, then as before."""
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(count)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)
