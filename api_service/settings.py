"""api_service settings, read from the environment (prefix MEMORY_) in main() only."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from api_service.limits import PlanLimits


class Limits(BaseModel):
    """Size limits on stored input (DESIGN.md defaults)."""

    content_chars: int = 100_000
    messages_per_append: int = 500
    title_chars: int = 512
    agent_id_chars: int = 256
    tags: int = 32
    tag_chars: int = 64
    metadata_bytes: int = 16 * 1024
    tool_field_chars: int = 256
    query_chars: int = 4_000
    body_bytes: int = 4 * 1024 * 1024


class ApiSettings(BaseSettings):
    """Settings of the api_service process."""

    model_config = SettingsConfigDict(
        env_prefix="MEMORY_", env_nested_delimiter="__", extra="ignore"
    )

    host: str = "127.0.0.1"
    port: int = 8080
    database_url: str | None = Field(
        default=None, validation_alias=AliasChoices("MEMORY_DATABASE_URL", "DATABASE_URL")
    )
    data_dir: Path = Path("var")
    db_pool_min: int = 2
    db_pool_max: int = 20
    embed_address: str = "127.0.0.1:50051"
    # Comma-separated host:port list; each org goes to one shard by rendezvous hashing.
    index_shards: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["127.0.0.1:50061"]
    )
    grpc_timeout_seconds: float = 10.0
    # The deadline of the embedding calls that index chunks. Nobody waits on them past an
    # append's own wait (below), so it is long: on a slow model (a CPU) a queue of work is
    # finished rather than thrown away at the deadline and embedded again.
    embed_index_timeout_seconds: float = 120.0
    # Embedding calls for indexing that one api process has under way at once. More wait their
    # turn here, where no deadline runs, rather than in embed_service's queue, where a long
    # queue (the model on a CPU, outpaced by appends) runs them past their deadline and the
    # work is thrown away. A few calls in flight still let embed_service batch across them.
    embed_index_concurrency: int = Field(default=4, ge=1)
    # How long an append waits for its own chunks to be indexed before answering anyway.
    append_index_wait_seconds: float = 10.0
    indexer_enabled: bool = True
    indexer_batch_size: int = 64
    cors_origins: list[str] = Field(default_factory=list)
    log_level: str = "INFO"
    limits: Limits = Field(default_factory=Limits)
    # Limits of orgs without a plan of their own (`memctl plan set`).
    default_plan: PlanLimits = Field(default_factory=PlanLimits)
    # Resolved API keys kept in memory, emptied on every change PostgreSQL announces
    # (auth.KeyCache); 0 looks every request's key up.
    key_cache_entries: int = 10_000
    # Failed authentications per client address and minute before it gets 429s.
    auth_failures_per_minute: int = 20
    metering_enabled: bool = True
    meter_flush_seconds: float = 1.0

    @field_validator("index_shards", mode="before")
    @classmethod
    def _split_shards(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [s.strip() for s in value.split(",") if s.strip()]
        return value

    @property
    def embedded_pg_dir(self) -> Path:
        return self.data_dir / "postgres"
