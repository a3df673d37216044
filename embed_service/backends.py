"""Build the configured embedder and the batch limits that suit its device."""

from __future__ import annotations

from embed_service.batcher import BatchLimits
from embed_service.embedder import Embedder
from embed_service.hashing import HashingEmbedder
from embed_service.settings import EmbedSettings

# Defaults per device. On the CPU, batches of 16 sorted by length were measured best for this
# model; on a GPU large batches and two in flight keep the device busy.
_DEFAULTS = {
    "cpu": {"batch_max_texts": 16, "batch_token_budget": 4096, "batches_in_flight": 1},
    "cuda": {"batch_max_texts": 512, "batch_token_budget": 131072, "batches_in_flight": 2},
}


def load_embedder(settings: EmbedSettings) -> Embedder:
    """Assemble (first run) and load the model, or build the hashing embedder. Blocking."""
    if settings.backend == "hashing":
        return HashingEmbedder()
    from embed_service.assembly import ensure_model_folder  # torch loads only when needed
    from embed_service.model import TransformerEmbedder, pick_device, pick_dtype

    folder = settings.model_dir or ensure_model_folder(settings.model_cache_dir)
    device = pick_device(settings.device)
    fused = {"auto": None, "on": True, "off": False}[settings.fused_attention]
    embedder = TransformerEmbedder(
        folder,
        device=device,
        threads=settings.torch_threads,
        fused_attention=fused,
        # "auto" is resolved by the model, after it has set its threads: it times both dtypes.
        dtype=None if settings.dtype == "auto" else pick_dtype(settings.dtype, device),
        cuda_graphs=settings.cuda_graphs,
    )
    # One small batch first, so that the first caller does not pay for lazy initialization.
    embedder.embed(embedder.tokenize(["warm-up"]))
    return embedder


def batch_limits(settings: EmbedSettings, device: str) -> BatchLimits:
    """Settings' batch limits, with per-device defaults for those left unset."""
    defaults = _DEFAULTS.get(device, _DEFAULTS["cpu"])
    return BatchLimits(
        max_queued_texts=settings.max_queued_texts,
        batch_max_texts=settings.batch_max_texts or defaults["batch_max_texts"],
        batch_token_budget=settings.batch_token_budget or defaults["batch_token_budget"],
        batches_in_flight=settings.batches_in_flight or defaults["batches_in_flight"],
        tokenizer_threads=settings.tokenizer_threads,
    )
