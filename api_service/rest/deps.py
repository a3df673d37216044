"""Request dependencies shared by the routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api_service.auth import Principal
from api_service.core.memory import MemoryService


# Async on purpose: FastAPI runs a plain `def` dependency in a worker thread, a hop per request.
async def _principal(request: Request) -> Principal:
    principal: Principal = request.state.principal  # set by the auth middleware
    return principal


async def _memory(request: Request) -> MemoryService:
    memory: MemoryService = request.app.state.memory
    return memory


Caller = Annotated[Principal, Depends(_principal)]
Memory = Annotated[MemoryService, Depends(_memory)]
