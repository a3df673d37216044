"""/api/v1/conversations routes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query

from api_service.core.memory import MAX_OFFSET
from api_service.rest import schemas
from api_service.rest.deps import Caller, Memory
from api_service.rest.errors import ERROR_RESPONSES

router = APIRouter(prefix="/conversations", tags=["conversations"], responses=ERROR_RESPONSES)


def split_tags(tags: str | None) -> list[str] | None:
    """`a,b` -> ["a", "b"]; an empty or absent parameter means no filter. Nothing is trimmed or
    dropped: `a,,b` and ` a` reach validation as they are and are refused, as on MCP."""
    return tags.split(",") if tags else None


@router.post("", status_code=201, response_model=schemas.ConversationCreated)
async def create_conversation(
    who: Caller,
    memory: Memory,
    # Every field is optional, so the body may be left out.
    body: Annotated[schemas.CreateConversationBody | None, Body()] = None,
) -> dict[str, Any]:
    body = body or schemas.CreateConversationBody()
    return await memory.create_conversation(
        who, title=body.title, agent_id=body.agent_id, tags=body.tags, metadata=body.metadata
    )


@router.get("", response_model=schemas.ConversationList)
async def list_conversations(
    who: Caller,
    memory: Memory,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    agent_id: str | None = None,
    tags: Annotated[str | None, Query(description="Comma-separated; all must match")] = None,
    sort: Literal["created_at", "updated_at", "message_count"] = "updated_at",
    order: Literal["asc", "desc"] = "desc",
) -> dict[str, Any]:
    return await memory.list_conversations(
        who,
        limit=limit,
        offset=offset,
        agent_id=agent_id,
        tags=split_tags(tags),
        sort=sort,
        order=order,
    )


@router.get("/{conversation_id}", response_model=schemas.ConversationWithMessages)
async def get_conversation(
    conversation_id: str,
    who: Caller,
    memory: Memory,
    message_limit: Annotated[int, Query(ge=1, le=500)] = 100,
    message_offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> dict[str, Any]:
    return await memory.get_conversation(
        who, conversation_id, message_limit=message_limit, message_offset=message_offset
    )


@router.delete("/{conversation_id}", response_model=schemas.Deleted)
async def delete_conversation(conversation_id: str, who: Caller, memory: Memory) -> dict[str, Any]:
    return await memory.delete_conversation(who, conversation_id)


@router.patch("/{conversation_id}/messages/{message_id}", response_model=schemas.MessageUpdated)
async def update_message(
    conversation_id: str,
    message_id: str,
    body: schemas.PatchMessageBody,
    who: Caller,
    memory: Memory,
) -> dict[str, Any]:
    return await memory.update_message(who, conversation_id, message_id, body.content)
