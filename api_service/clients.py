"""gRPC clients of embed_service and the index shards, with deadlines and shard routing."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import numpy as np
import numpy.typing as npt

from api_service import timing
from index_service.routing import routing_epoch, shard_for
from memory_proto import embed_pb2, embed_pb2_grpc, index_pb2, index_pb2_grpc

Vectors = npt.NDArray[np.float32]

_CHANNEL_OPTIONS = [
    # Texts and vectors of a large batch exceed gRPC's default 4 MiB message size.
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # Reconnect within seconds of a restarted service, not gRPC's default of up to 2 minutes.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


# While a call is under way its channel pings the server every KEEPALIVE_MS and gives the
# connection up if no answer comes within KEEPALIVE_TIMEOUT_MS: a server whose machine is gone
# without closing its connections (a node lost) fails the call in seconds, not at its
# deadline (two minutes for an embedding, which the indexer then halves and retries). A
# gRPC server takes any number of pings while a call is under way, and none are sent without
# one.
KEEPALIVE_MS = 20_000
KEEPALIVE_TIMEOUT_MS = 10_000


def _channel(address: str, *, balanced: bool = False) -> grpc.aio.Channel:
    """A channel to `address`; `balanced` spreads calls over every address the name resolves to
    (several embed_service replicas behind one DNS name) instead of pinning one connection."""
    options: list[tuple[str, int | str]] = [
        *_CHANNEL_OPTIONS,
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        # What gRPC waits for a ping's answer (its default, a minute, wins over the above).
        ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        # A call waiting for its answer sends no data; pings go on regardless.
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if balanced:
        options.append(("grpc.lb_policy_name", "round_robin"))
    return grpc.aio.insecure_channel(address, options=options)


class EmbedClient:
    """Embeds texts through embed_service."""

    def __init__(self, address: str, timeout: float) -> None:
        self.address = address
        self._channel = _channel(address, balanced=True)
        self._stub: embed_pb2_grpc.EmbedServiceAsyncStub = embed_pb2_grpc.EmbedServiceStub(
            self._channel
        )
        self._timeout = timeout
        # The dimensions of the vectors the service last answered with; None before its first
        # answer.
        self.dim: int | None = None

    async def embed(self, texts: Sequence[str], timeout: float | None = None) -> Vectors:
        """One L2-normalized float32 row per text, in order; `timeout` replaces the client's
        deadline."""
        with timing.part("embed"):
            reply = await self._stub.Embed(
                embed_pb2.EmbedRequest(texts=list(texts)), timeout=timeout or self._timeout
            )
        self.dim = reply.dim
        vectors = np.frombuffer(reply.vectors, dtype="<f4").astype(np.float32, copy=False)
        return vectors.reshape(len(texts), reply.dim)

    async def ready(self) -> bool:
        reply = await self._stub.Health(embed_pb2.HealthRequest(), timeout=self._timeout)
        if reply.ready:
            self.dim = reply.dim
        return bool(reply.ready)

    async def close(self) -> None:
        await self._channel.close()


class IndexRouter:
    """Routes each org's index calls to its shard (rendezvous hashing over `shards`)."""

    def __init__(self, shards: Sequence[str], timeout: float) -> None:
        if not shards:
            raise ValueError("at least one index shard address is required")
        self.shards = list(shards)
        self._epoch = routing_epoch(self.shards)
        self._channels = {address: _channel(address) for address in self.shards}
        self._stubs: dict[str, index_pb2_grpc.IndexServiceAsyncStub] = {
            address: index_pb2_grpc.IndexServiceStub(channel)
            for address, channel in self._channels.items()
        }
        self._timeout = timeout

    def shard_of(self, org_id: str) -> str:
        """The address of the org's shard."""
        return shard_for(org_id, self.shards)

    def _stub(self, org_id: str) -> index_pb2_grpc.IndexServiceAsyncStub:
        return self._stubs[self.shard_of(org_id)]

    async def upsert(
        self, org_id: str, items: Sequence[tuple[str, str, int, bytes]], dim: int
    ) -> None:
        """Insert or replace (chunk_id, conversation_id, version, float32 bytes) items; the shard
        keeps a newer version it already holds."""
        request = index_pb2.UpsertRequest(
            org_id=org_id,
            dim=dim,
            routing_epoch=self._epoch,
            items=[
                index_pb2.VectorItem(chunk_id=c, conversation_id=v, version=n, vector=b)
                for c, v, n, b in items
            ],
        )
        with timing.part("index"):
            await self._stub(org_id).Upsert(request, timeout=self._timeout)

    async def delete_conversation(self, org_id: str, conversation_id: str) -> None:
        await self._stub(org_id).Delete(
            index_pb2.DeleteRequest(
                org_id=org_id, conversation_ids=[conversation_id], routing_epoch=self._epoch
            ),
            timeout=self._timeout,
        )

    async def search(
        self, org_id: str, query: Vectors, k: int, conversation_ids: Sequence[str] | None
    ) -> list[tuple[str, float]]:
        request = index_pb2.SearchRequest(
            org_id=org_id,
            query=query.astype("<f4").tobytes(),
            dim=query.shape[-1],
            k=k,
            conversation_ids=list(conversation_ids or ()),
            routing_epoch=self._epoch,
        )
        with timing.part("index"):
            reply = await self._stub(org_id).Search(request, timeout=self._timeout)
        return [(hit.chunk_id, hit.score) for hit in reply.hits]

    async def ready(self) -> dict[str, bool]:
        status = {}
        for address, stub in self._stubs.items():
            try:
                reply = await stub.Health(index_pb2.IndexHealthRequest(), timeout=self._timeout)
                status[address] = bool(reply.ready)
            except grpc.aio.AioRpcError:
                status[address] = False
        return status

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


class GrpcSemanticIndex:
    """SemanticIndex over the two services: embed the query, search the org's shard."""

    def __init__(self, embedder: EmbedClient, index: IndexRouter) -> None:
        self._embedder = embedder
        self._index = index

    async def embed_query(self, query: str) -> Vectors:
        vectors = await self._embedder.embed([query])
        return vectors[:1]  # the one row, as a (1, dim) matrix

    async def nearest(
        self, org_id: str, query: Vectors, k: int, conversation_ids: Sequence[str] | None
    ) -> list[tuple[str, float]]:
        return await self._index.search(org_id, query, k, conversation_ids)
