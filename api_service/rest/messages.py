"""/api/v1/messages route."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api_service.rest import schemas
from api_service.rest.deps import Caller, Memory
from api_service.rest.errors import ERROR_RESPONSES

router = APIRouter(tags=["messages"], responses=ERROR_RESPONSES)


@router.post("/messages", response_model=schemas.MessagesAppended, response_model_exclude_none=True)
async def append_messages(
    body: schemas.AppendMessagesBody, who: Caller, memory: Memory
) -> dict[str, Any]:
    appended = await memory.append_messages(
        who, body.conversation_id, [m.to_new() for m in body.messages]
    )
    if body.conversation_id is not None:  # the caller knows it: the same body as MCP's
        del appended["conversation_id"]
    return appended
