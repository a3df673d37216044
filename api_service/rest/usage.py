"""/api/v1/usage: the org's requests, storage, conversations and messages against its plan."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from api_service.limits import Meter, month_start, utc_now
from api_service.rest import schemas
from api_service.rest.deps import Caller, Memory
from api_service.rest.errors import ERROR_RESPONSES

router = APIRouter(tags=["usage"], responses=ERROR_RESPONSES)


@router.get("/usage", response_model=schemas.Usage)
async def usage(request: Request, who: Caller, memory: Memory) -> dict[str, Any]:
    meter: Meter | None = request.app.state.meter
    now = meter.now() if meter else utc_now()
    requests = await meter.used(who.org_id) if meter else 0
    return await memory.usage(who, requests, month_start(now).strftime("%Y-%m"))
