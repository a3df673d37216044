"""Rows as frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class Conversation:
    org_id: str
    conversation_id: str
    title: str | None
    agent_id: str | None
    tags: list[str]
    metadata: dict[str, Any]
    message_count: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Message:
    conversation_id: str
    message_id: str
    sequence: int
    role: str
    content: str
    tool_call_id: str | None
    tool_name: str | None
    metadata: dict[str, Any] | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class NewMessage:
    role: str
    content: str
    tool_call_id: str | None = None
    tool_name: str | None = None
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ChunkRow:
    chunk_id: str
    conversation_id: str
    start_sequence: int
    end_sequence: int
    text: str


@dataclass(frozen=True, slots=True)
class Charge:
    """What a write adds to its org's totals, and the plan's limits it must stay within."""

    storage_bytes: int
    conversations: int
    messages: int
    max_storage_bytes: int
    max_conversations: int
    max_messages: int

    def params(self) -> tuple[int, int, int, int, int, int]:
        return (
            self.storage_bytes,
            self.conversations,
            self.messages,
            self.max_storage_bytes,
            self.max_conversations,
            self.max_messages,
        )


@dataclass(frozen=True, slots=True)
class QueuedChunks:
    """An outbox upsert job and the chunks it covers, as written: (chunk_id, version, text)."""

    job_id: int
    org_id: str
    conversation_id: str
    chunks: list[tuple[str, int, str]]


@dataclass(frozen=True, slots=True)
class ApiKey:
    org_id: str
    key_id: str
    prefix: str
    scopes: list[str]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


@dataclass(frozen=True, slots=True)
class Org:
    org_id: str
    name: str
    plan: str | None
    created_at: datetime
