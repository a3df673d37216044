"""What the memory core needs from outside, as protocols (gRPC in production, fakes in tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from api_service.store.records import QueuedChunks

# A query's embedding: made by `SemanticIndex.embed_query`, passed back to its `nearest`.
QueryVector = Any


class SemanticIndex(Protocol):
    async def embed_query(self, query: str) -> QueryVector:
        """The embedding of a search query."""
        ...

    async def nearest(
        self, org_id: str, query: QueryVector, k: int, conversation_ids: Sequence[str] | None
    ) -> list[tuple[str, float]]:
        """(chunk_id, cosine score) of the org's k chunks nearest to the embedded `query`,
        best first, restricted to `conversation_ids` before ranking when given."""
        ...


class Indexing(Protocol):
    # How long a job queued for the caller to index itself is kept from the background worker.
    lease_seconds: float

    @property
    def busy(self) -> bool:
        """Whether a write should leave its job to the background workers rather than index
        it itself (too many writes' own indexing under way)."""
        ...

    def notify(self) -> None:
        """New outbox jobs were committed."""
        ...

    def embed_ahead(self, texts: Sequence[str]) -> asyncio.Future[Any]:
        """Start embedding chunk texts before their transaction commits, for `index_now`."""
        ...

    async def index_now(
        self, queued: QueuedChunks, timeout: float, embedding: asyncio.Future[Any] | None = None
    ) -> bool:
        """Index the chunks of a job queued leased to the caller, with their `embedding` from
        `embed_ahead` if started; True once searchable within `timeout` seconds (else it is
        finished in the background)."""
        ...
