"""Helpers for index tests: vectors, a shard on a loopback port, plain-SQL test rows."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import grpc
import numpy as np

from index_service.main import IndexServer, start_server
from index_service.settings import IndexSettings
from memory_proto import index_pb2, index_pb2_grpc

DIM = 768


def clustered(n: int, seed: int, topics: int = 50, spread: float = 1.0) -> np.ndarray:
    """Unit vectors around `topics` fixed random centers, like sentence embeddings: every call
    draws from the same topics, so queries resemble stored chunks as real questions do."""
    centers = np.random.default_rng(0).standard_normal((topics, DIM)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((n, DIM)).astype(np.float32) * (spread / np.sqrt(DIM))
    out = centers[rng.integers(0, topics, n)] + noise
    return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def item(chunk_id: str, conversation_id: str, vector: np.ndarray) -> index_pb2.VectorItem:
    return index_pb2.VectorItem(
        chunk_id=chunk_id, conversation_id=conversation_id, vector=vector.astype("<f4").tobytes()
    )


def upsert_request(
    org: str, chunks: Sequence[tuple[str, str, np.ndarray]], epoch: int = 0
) -> index_pb2.UpsertRequest:
    return index_pb2.UpsertRequest(
        org_id=org, dim=DIM, items=[item(*c) for c in chunks], routing_epoch=epoch
    )


def search_request(
    org: str, query: np.ndarray, k: int, conversations: Sequence[str] = (), epoch: int = 0
) -> index_pb2.SearchRequest:
    return index_pb2.SearchRequest(
        org_id=org,
        query=query.astype("<f4").tobytes(),
        dim=DIM,
        k=k,
        conversation_ids=list(conversations),
        routing_epoch=epoch,
    )


def hit_tuples(response: index_pb2.SearchResponse) -> list[tuple[str, str, float]]:
    return [(h.chunk_id, h.conversation_id, h.score) for h in response.hits]


@asynccontextmanager
async def shard(
    database_url: str | None = None, **overrides: Any
) -> AsyncIterator[tuple[IndexServer, index_pb2_grpc.IndexServiceStub]]:
    """A running shard on a free loopback port and a client stub for it."""
    settings = IndexSettings(host="127.0.0.1", port=0, database_url=database_url, **overrides)
    server = await start_server(settings)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield server, index_pb2_grpc.IndexServiceStub(channel)
    finally:
        await channel.close()
        await server.stop(grace=1.0)


async def insert_chunks(
    database_url: str, org: str, chunks: Sequence[tuple[str, str, np.ndarray | None]]
) -> None:
    """Insert the org, its conversations and (chunk_id, conversation_id, vector) rows."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO orgs (org_id, name) VALUES ($1, $1) ON CONFLICT DO NOTHING", org
        )
        await conn.executemany(
            "INSERT INTO conversations (org_id, conversation_id) VALUES ($1, $2) "
            "ON CONFLICT DO NOTHING",
            sorted({(org, conversation) for _, conversation, _ in chunks}),
        )
        # Windows start at 1, 4, 7, ... in each conversation.
        await conn.executemany(
            """WITH chunk AS (
                   INSERT INTO chunks (org_id, conversation_id, start_sequence, chunk_id,
                                       end_sequence, text)
                   SELECT $1, $2, s, $3, s + 4, $3
                     FROM (SELECT COALESCE(max(start_sequence), -2) + 3 AS s FROM chunks
                            WHERE org_id = $1 AND conversation_id = $2) AS next
                   RETURNING org_id, conversation_id, start_sequence, version)
               INSERT INTO chunk_vectors (org_id, conversation_id, start_sequence, version,
                                          embedding)
               SELECT org_id, conversation_id, start_sequence, version, $4 FROM chunk
                WHERE $4::bytea IS NOT NULL""",
            [
                (org, conversation, chunk_id, None if v is None else v.astype("<f4").tobytes())
                for chunk_id, conversation, v in chunks
            ],
        )
    finally:
        await conn.close()


async def execute(database_url: str, sql: str, *args: Any) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()
