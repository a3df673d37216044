"""What the memory core needs from outside, as protocols (gRPC in production, fakes in tests)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class SemanticIndex(Protocol):
    async def nearest(
        self, org_id: str, query: str, k: int, conversation_ids: Sequence[str] | None
    ) -> list[tuple[str, float]]:
        """(chunk_id, cosine score) of the org's chunks nearest to `query`, best first,
        restricted to `conversation_ids` before ranking when given."""
        ...


class IndexWaiter(Protocol):
    def notify(self) -> None:
        """New outbox jobs were committed."""
        ...

    async def wait_done(self, job_ids: Sequence[int], timeout: float) -> bool:
        """Wait up to `timeout` seconds for the jobs to be done; True if they are."""
        ...
