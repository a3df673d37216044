"""What memctl's commands share: the database they work on and their error type."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from api_service.settings import ApiSettings
from api_service.store.db import Conn, create_pool
from api_service.store.embedded import start_embedded
from api_service.store.migrate import migrate_url


class CliError(Exception):
    """A failure to report as one line, exit status 1."""


@contextlib.contextmanager
def database(settings: ApiSettings) -> Iterator[str]:
    """The database URL: DATABASE_URL, or the embedded server under the data dir."""
    if settings.database_url:
        yield settings.database_url
        return
    url, server = start_embedded(settings.embedded_pg_dir)
    try:
        yield url
    finally:
        server.cleanup()


async def with_conn(url: str, work: Callable[[Conn], Any]) -> Any:
    await migrate_url(url)
    pool = await create_pool(url, 1, 2)
    try:
        async with pool.acquire() as conn:
            return await work(conn)
    finally:
        await pool.close()


def on_database(settings: ApiSettings, work: Callable[[Conn], Any]) -> Any:
    """Run `work` with a connection to the configured (or embedded) database, migrated."""
    with database(settings) as url:
        return asyncio.run(with_conn(url, work))
