"""IndexService gRPC servicer: validates requests, calls the registry, maps errors to statuses."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc

from index_service.errors import InvalidArgument, ServiceError, Unavailable
from index_service.registry import Registry
from index_service.vectors import decode
from memory_proto import index_pb2, index_pb2_grpc

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

# The one place errors become statuses.
_STATUS: dict[type[ServiceError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
}

Handler: TypeAlias = Callable[["IndexServicer", Req, Ctx], Awaitable[Resp]]


def _maps_errors(handler: Handler[Req, Resp]) -> Handler[Req, Resp]:
    @functools.wraps(handler)
    async def wrapper(self: IndexServicer, request: Req, context: Ctx) -> Resp:
        try:
            return await handler(self, request, context)
        except ServiceError as exc:
            await context.abort(_STATUS.get(type(exc), grpc.StatusCode.INTERNAL), str(exc))
            raise  # abort raises; this line only satisfies the type checker

    return wrapper


class IndexServicer(index_pb2_grpc.IndexServiceServicer):
    """Implements proto/memory/v1/index.proto over a Registry."""

    def __init__(self, registry: Registry, *, dim: int, max_k: int, device: str) -> None:
        self._registry = registry
        self._dim = dim
        self._max_k = max_k
        self._device = device
        self.ready = False

    @_maps_errors
    async def Upsert(
        self, request: index_pb2.UpsertRequest, context: Ctx
    ) -> index_pb2.UpsertResponse:
        """Insert or replace vectors by chunk id."""
        self._check_org(request.org_id)
        self._check_dim(request.dim)
        items = list(request.items)
        for position, item in enumerate(items):
            if not item.chunk_id or not item.conversation_id:
                raise InvalidArgument(f"item {position} needs chunk_id and conversation_id")
        if not items:
            return index_pb2.UpsertResponse(upserted=0)
        vectors = decode([item.vector for item in items], self._dim)
        upserted = await self._registry.upsert(
            request.org_id,
            request.routing_epoch,
            [item.chunk_id for item in items],
            [item.conversation_id for item in items],
            vectors,
            [item.version for item in items],
        )
        return index_pb2.UpsertResponse(upserted=upserted)

    @_maps_errors
    async def Delete(
        self, request: index_pb2.DeleteRequest, context: Ctx
    ) -> index_pb2.DeleteResponse:
        """Remove vectors by chunk id and by conversation."""
        self._check_org(request.org_id)
        if not request.chunk_ids and not request.conversation_ids:
            raise InvalidArgument("delete needs chunk_ids or conversation_ids")
        deleted = await self._registry.delete(
            request.org_id,
            request.routing_epoch,
            list(request.chunk_ids),
            list(request.conversation_ids),
        )
        return index_pb2.DeleteResponse(deleted=deleted)

    @_maps_errors
    async def DropOrg(
        self, request: index_pb2.DropOrgRequest, context: Ctx
    ) -> index_pb2.DropOrgResponse:
        """Forget an org's whole index."""
        self._check_org(request.org_id)
        return index_pb2.DropOrgResponse(deleted=await self._registry.drop(request.org_id))

    @_maps_errors
    async def Search(
        self, request: index_pb2.SearchRequest, context: Ctx
    ) -> index_pb2.SearchResponse:
        """Top-k by cosine similarity, restricted before ranking to the given conversations."""
        self._check_org(request.org_id)
        self._check_dim(request.dim)
        if not 1 <= request.k <= self._max_k:
            raise InvalidArgument(f"k must be between 1 and {self._max_k}")
        query = decode([request.query], self._dim)
        hits = await self._registry.search(
            request.org_id,
            request.routing_epoch,
            query,
            request.k,
            list(request.conversation_ids),
            request.nprobe,
        )
        return index_pb2.SearchResponse(
            hits=[
                index_pb2.SearchHit(
                    chunk_id=h.chunk_id, conversation_id=h.conversation_id, score=h.score
                )
                for h in hits
            ]
        )

    @_maps_errors
    async def Stats(self, request: index_pb2.StatsRequest, context: Ctx) -> index_pb2.StatsResponse:
        """Sizes of one org, or of the whole shard when org_id is empty."""
        stats = await self._registry.stats(request.org_id, request.routing_epoch)
        return index_pb2.StatsResponse(
            vectors=stats.vectors,
            orgs=stats.orgs,
            index_kind=stats.index_kind,
            memory_bytes=stats.memory_bytes,
            building=stats.building,
            nlist=stats.nlist,
            nprobe=stats.nprobe,
        )

    async def Health(
        self, request: index_pb2.IndexHealthRequest, context: Ctx
    ) -> index_pb2.IndexHealthResponse:
        """Ready once the orgs this shard owns are loaded (requests are served before that)."""
        return index_pb2.IndexHealthResponse(
            ready=self.ready, device=self._device, orgs=self._registry.org_count
        )

    def _check_org(self, org_id: str) -> None:
        if not org_id:
            raise InvalidArgument("org_id is required")

    def _check_dim(self, dim: int) -> None:
        if dim != self._dim:
            raise InvalidArgument(f"dim is {dim}; this index holds {self._dim}-dimension vectors")
