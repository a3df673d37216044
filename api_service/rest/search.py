"""/api/v1/search route (hybrid: vector and full-text rankings fused)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from api_service.rest import schemas
from api_service.rest.conversations import split_tags
from api_service.rest.deps import Caller, Memory
from api_service.rest.errors import ERROR_RESPONSES

router = APIRouter(tags=["search"], responses=ERROR_RESPONSES)


@router.get("/search", response_model=schemas.SearchResults)
async def search(
    who: Caller,
    memory: Memory,
    q: Annotated[str, Query(min_length=1, description="Natural-language query")],
    limit: Annotated[int, Query(ge=1, le=50)] = 5,
    conversation_id: str | None = None,
    tags: Annotated[str | None, Query(description="Comma-separated; all must match")] = None,
    project: Annotated[
        str | None, Query(description="Only conversations whose metadata.project equals this")
    ] = None,
    snippet_chars: Annotated[int, Query(ge=15, le=5000)] = 1500,
) -> dict[str, Any]:
    return await memory.search(
        who,
        q,
        limit=limit,
        conversation_id=conversation_id,
        tags=split_tags(tags),
        project=project,
        snippet_chars=snippet_chars,
        hybrid=True,
        query_name="q",
    )
