"""Index service settings: environment variables with the prefix INDEX_."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class IndexSettings(BaseSettings):
    """Configuration of one index shard."""

    model_config = SettingsConfigDict(env_prefix="INDEX_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=50061, ge=0, le=65535, description="gRPC port; 0 picks a free port.")
    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("INDEX_DATABASE_URL", "DATABASE_URL"),
        description="PostgreSQL URL to rebuild orgs from (INDEX_DATABASE_URL or DATABASE_URL). "
        "Unset: orgs start empty and nothing survives a restart.",
    )
    dim: int = Field(default=768, ge=1, le=65536, description="Vector dimensions.")
    # Past 4,096 vectors the calibrated IVF index scans in 0.63x the flat store's time on the
    # e2e corpus, 0.54x at 8k and 0.41x at 12k (benchmarks/e2e/flat_or_ivf.py); below it the
    # exact scan costs at most 0.2 ms more.
    flat_threshold: int = Field(
        default=4096,
        ge=16,  # an IVF index has at least 16 lists, each trained on one vector at least
        description="Orgs with up to this many vectors use exact flat search; larger ones an "
        "IVF index calibrated to target_recall.",
    )
    target_recall: float = Field(
        default=0.97,
        gt=0.0,
        le=1.0,
        description="Recall@10 against exact search that each IVF index is calibrated to.",
    )
    max_k: int = Field(
        default=1000,
        ge=800,
        description="Largest k a search may ask for; at least 800, the most the API asks for "
        "(a search of 50 results whose first hits were deleted since).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="cpu, or auto (CPU; GPU indexes are not supported, cuda is refused).",
    )
    shards: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated shard names (as the API routes with). With shard_name, "
        "the orgs this shard owns are loaded at start.",
    )
    shard_name: str = Field(default="", description="This shard's entry in INDEX_SHARDS.")
    search_threads: int = Field(
        default=0,
        ge=0,
        description="Threads serving searches, upserts and deletes (the shortest run on the "
        "event loop); 0: one per CPU core.",
    )
    max_message_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="Largest gRPC request or response."
    )
    load_batch_rows: int = Field(
        default=5000,
        ge=1,
        description="Rows fetched per round trip when rebuilding from PostgreSQL.",
    )

    @field_validator("shards", mode="before")
    @classmethod
    def _split_shards(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value
