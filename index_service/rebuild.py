"""Reading an org's chunk vectors from PostgreSQL, the source of truth (read-only)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg
import numpy as np

from index_service.vectors import Matrix, normalize

log = logging.getLogger(__name__)

# Ordered by chunk id, so every rebuild of the same rows builds the same index and answers the
# same. A vector counts only for the version of its window it was embedded from.
_ORG_CHUNKS = """
SELECT c.chunk_id, c.conversation_id, c.version, v.embedding
  FROM chunks c JOIN chunk_vectors v USING (org_id, conversation_id, start_sequence, version)
 WHERE c.org_id = $1
 ORDER BY c.chunk_id
"""
_ORGS = "SELECT org_id FROM orgs ORDER BY org_id"


@dataclass(frozen=True)
class OrgRows:
    """An org's embedded chunks: ids, unit-norm vectors and row versions, row for row."""

    chunk_ids: list[str]
    conversation_ids: list[str]
    vectors: Matrix
    versions: list[int]


class PostgresSource:
    """Streams chunk vectors from PostgreSQL with a server-side cursor."""

    def __init__(self, database_url: str, dim: int, batch_rows: int) -> None:
        self._url = database_url
        self._dim = dim
        self._batch_rows = batch_rows
        self._pool: asyncpg.Pool | None = None

    async def start(self) -> None:
        """Open the connection pool (connections are made on first use)."""
        self._pool = await asyncpg.create_pool(self._url, min_size=0, max_size=4)

    async def close(self) -> None:
        """Close the pool."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def org_ids(self) -> list[str]:
        """Every org id in the database."""
        async with self._acquire() as conn:
            return [row["org_id"] for row in await conn.fetch(_ORGS)]

    async def load(self, org_id: str) -> OrgRows:
        """Every embedded chunk of `org_id`. Rows whose vector is malformed are skipped with
        a warning: one bad row must not keep the whole org from being served."""
        chunk_ids: list[str] = []
        conversation_ids: list[str] = []
        versions: list[int] = []
        blocks: list[Matrix] = []
        width = self._dim * 4
        async with self._acquire() as conn, conn.transaction(readonly=True):
            cursor = await conn.cursor(_ORG_CHUNKS, org_id)
            while rows := await cursor.fetch(self._batch_rows):
                good = [row for row in rows if len(row["embedding"]) == width]
                if len(good) != len(rows):
                    skipped = len(rows) - len(good)
                    log.warning("org %s: skipped %d malformed vectors", org_id, skipped)
                block = np.frombuffer(b"".join(r["embedding"] for r in good), dtype="<f4")
                block = block.reshape(len(good), self._dim).astype(np.float32)
                finite = np.isfinite(block).all(axis=1) & (np.abs(block).sum(axis=1) > 0)
                if not finite.all():
                    log.warning(
                        "org %s: skipped %d non-finite or zero vectors",
                        org_id,
                        int((~finite).sum()),
                    )
                kept = [r for r, ok in zip(good, finite, strict=True) if ok]
                chunk_ids.extend(r["chunk_id"] for r in kept)
                conversation_ids.extend(r["conversation_id"] for r in kept)
                versions.extend(r["version"] for r in kept)
                blocks.append(normalize(block[finite], check=False))
        vectors = np.concatenate(blocks) if blocks else np.empty((0, self._dim), np.float32)
        return OrgRows(chunk_ids, conversation_ids, vectors, versions)

    def _acquire(self) -> asyncpg.pool.PoolAcquireContext:
        if self._pool is None:
            raise RuntimeError("PostgresSource.start() was not awaited")
        return self._pool.acquire()
