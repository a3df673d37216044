"""Choosing where FAISS runs."""

from __future__ import annotations

import logging

import faiss

log = logging.getLogger(__name__)


def resolve_device(requested: str) -> str:
    """The device the indexes run on, for the setting's 'auto' | 'cpu' | 'cuda'.

    Indexes run on the CPU. GPU indexes need a FAISS build with GPU support, which is not
    part of this service yet: 'cuda' is refused rather than silently served from the CPU, and
    'auto' logs that a visible GPU goes unused.
    """
    gpus = int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0
    if requested == "cuda":
        raise RuntimeError("INDEX_DEVICE=cuda: GPU FAISS indexes are not supported; use cpu")
    if requested == "auto" and gpus > 0:
        log.warning("FAISS sees %d GPU(s), but indexes run on the CPU", gpus)
    return "cpu"
