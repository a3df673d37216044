"""Request dependencies shared by the routes."""

from __future__ import annotations

from collections import Counter
from typing import Annotated

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from api_service.auth import Principal
from api_service.core.errors import InvalidInput
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


def _query_names(dependant: Dependant) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    return names.union(*(_query_names(d) for d in dependant.dependencies))


async def known_query(request: Request) -> None:
    """Refuse query parameters the operation does not take, as bodies refuse unknown fields:
    a misspelt `limt=5` must not be answered as if it were not there. Every parameter of this
    API takes one value (tags are comma-separated), so a repeated one is refused too rather
    than answered with its last value."""
    route: APIRoute = request.scope["route"]
    declared = _query_names(route.dependant)
    unknown = sorted(set(request.query_params) - declared)
    if unknown:
        takes = ", ".join(sorted(declared)) or "none"
        raise InvalidInput(
            f"Unknown query parameter: {', '.join(unknown)} (this operation takes: {takes})"
        )
    given = Counter(name for name, _ in request.query_params.multi_items())
    repeated = sorted(name for name, count in given.items() if count > 1)
    if repeated:
        raise InvalidInput(
            f"Query parameter given more than once: {', '.join(repeated)} (each takes one "
            "value; give tags as one comma-separated list)"
        )
