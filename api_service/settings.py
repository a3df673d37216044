"""api_service settings, read from the environment (prefix MEMORY_) in main() only."""

from __future__ import annotations

import json
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

    host: str = Field(default="127.0.0.1", description="address to listen on")
    port: int = Field(default=8080, description="port to listen on")
    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("MEMORY_DATABASE_URL", "DATABASE_URL"),
        description="PostgreSQL URL (MEMORY_DATABASE_URL or DATABASE_URL); unset: an embedded "
        "PostgreSQL under the data folder",
    )
    data_dir: Path = Field(default=Path("var"), description="folder of the embedded PostgreSQL")
    db_pool_min: int = Field(default=2, description="PostgreSQL connections kept open")
    db_pool_max: int = Field(default=20, description="PostgreSQL connections at most")
    embed_address: str = Field(default="127.0.0.1:50051", description="embed_service host:port")
    # Each org goes to one shard by rendezvous hashing.
    index_shards: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["127.0.0.1:50061"],
        description="index shards, comma-separated host:port (every api process the same list)",
    )
    grpc_timeout_seconds: float = Field(
        default=10.0, description="deadline of a request's calls to embed_service and the shards"
    )
    # Nobody waits on these calls past an append's own wait (below), so it is long: on a slow
    # model (a CPU) a queue of work is finished rather than thrown away at the deadline and
    # embedded again.
    embed_index_timeout_seconds: float = Field(
        default=120.0, description="deadline of the embedding calls that index chunks"
    )
    # More wait their turn here, where no deadline runs, rather than in embed_service's queue,
    # where a long queue (the model on a CPU, outpaced by appends) runs them past their
    # deadline and the work is thrown away. A few calls in flight still let embed_service
    # batch across them.
    embed_index_concurrency: int = Field(
        default=4, ge=1, description="embedding calls for indexing under way at once, per process"
    )
    append_index_wait_seconds: float = Field(
        default=10.0,
        description="how long an append waits for its chunks to be searchable before answering",
    )
    indexer_enabled: bool = Field(
        default=True, description="run the background indexer that drains the index outbox"
    )
    indexer_batch_size: int = Field(default=64, description="outbox jobs the indexer takes at once")
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="browser origins allowed by CORS, comma-separated (none: CORS off)",
    )
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")
    limits: Limits = Field(default_factory=Limits, description="size limits on stored input")
    default_plan: PlanLimits = Field(
        default_factory=PlanLimits,
        description="limits of orgs without a plan of their own (memctl plan set)",
    )
    key_cache_entries: int = Field(
        default=10_000,
        description="resolved API keys kept in memory, emptied on every change PostgreSQL "
        "announces (0: look every request's key up)",
    )
    auth_failures_per_minute: int = Field(
        default=20,
        description="failed authentications per client address a minute; past it, 401s with "
        "Retry-After",
    )
    metering_enabled: bool = Field(default=True, description="count requests against plans")
    meter_flush_seconds: float = Field(
        default=1.0, description="how often counted requests are written to PostgreSQL"
    )

    @field_validator("index_shards", "cors_origins", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        """Comma-separated, or a JSON array."""
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                return json.loads(value)
            return [s.strip() for s in value.split(",") if s.strip()]
        return value

    @property
    def embedded_pg_dir(self) -> Path:
        return self.data_dir / "postgres"


def env_help() -> str:
    """Every setting's variable, default and meaning, for --help (nested ones as
    MEMORY_<FIELD>__<NAME>)."""
    lines = ["environment variables:"]
    for name, info in ApiSettings.model_fields.items():
        default = info.get_default(call_default_factory=True, validated_data={})
        if isinstance(default, BaseModel):
            lines.append(f"  MEMORY_{name.upper()}__*: {info.description}")
            for part, value in default.model_dump().items():
                lines.append(f"    MEMORY_{name.upper()}__{part.upper()} (default: {value})")
            continue
        if isinstance(default, list):
            default = ",".join(default) or "none"
        variable = f"MEMORY_{name.upper()}" + (" or DATABASE_URL" if name == "database_url" else "")
        lines.append(f"  {variable} (default: {'unset' if default is None else default})")
        lines.append(f"      {info.description}")
    return "\n".join(lines)
