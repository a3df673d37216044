"""Response shapes of the contract, shared by REST and MCP."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from api_service.store.records import Conversation, Message


def timestamp(value: datetime) -> str:
    """ISO 8601 UTC with `Z`, millisecond precision."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def conversation(c: Conversation) -> dict[str, Any]:
    return {
        "id": c.conversation_id,
        "title": c.title,
        "agent_id": c.agent_id,
        "tags": c.tags,
        "metadata": c.metadata,
        "message_count": c.message_count,
        "created_at": timestamp(c.created_at),
        "updated_at": timestamp(c.updated_at),
    }


def conversation_summary(c: Conversation) -> dict[str, Any]:
    return {
        "id": c.conversation_id,
        "title": c.title,
        "agent_id": c.agent_id,
        "tags": c.tags,
        "message_count": c.message_count,
        "updated_at": timestamp(c.updated_at),
    }


def message(m: Message) -> dict[str, Any]:
    return {
        "id": m.message_id,
        "role": m.role,
        "content": m.content,
        "sequence": m.sequence,
        "created_at": timestamp(m.created_at),
        "tool_call_id": m.tool_call_id,
        "tool_name": m.tool_name,
        "metadata": m.metadata,
    }
