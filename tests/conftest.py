"""Shared fixtures: a real PostgreSQL (DATABASE_URL, or an embedded server) and a fresh,
migrated database per test, copied from a template migrated once per run."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

# Tests fork only to exec (PostgreSQL's pg_ctl, services in subprocesses), from a process that
# runs gRPC servers and clients: gRPC's fork handlers then crash the child now and then.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import asyncpg
import pytest

from api_service.store.migrate import migrate_url

TEMPLATE_DB = f"memtest_template_{os.getpid()}"


def _with_database(url: str, database: str) -> str:
    """`url` pointing at another database on the same server."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture(scope="session")
def pg_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of an admin database on a real PostgreSQL server."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    from api_service.store.embedded import start_embedded

    data_dir: Path = tmp_path_factory.mktemp("pg") / "data"
    url, server = start_embedded(data_dir)
    yield url
    server.cleanup()


@pytest.fixture(scope="session")
async def template_db(pg_server_url: str) -> AsyncIterator[str]:
    admin = await asyncpg.connect(pg_server_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}"')
        await admin.execute(f'CREATE DATABASE "{TEMPLATE_DB}"')
        await migrate_url(_with_database(pg_server_url, TEMPLATE_DB))
        yield TEMPLATE_DB
        await admin.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)')
    finally:
        await admin.close()


async def _scratch_database(server_url: str, template: str | None) -> AsyncIterator[str]:
    """URL of a new database (a copy of `template`, or empty), dropped afterwards."""
    name = f"memtest_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server_url)
    try:
        copy = f' TEMPLATE "{template}"' if template else ""
        await admin.execute(f'CREATE DATABASE "{name}"{copy}')
        yield _with_database(server_url, name)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def database_url(pg_server_url: str, template_db: str) -> AsyncIterator[str]:
    """A fresh, fully migrated database for one test, dropped afterwards."""
    async for url in _scratch_database(pg_server_url, template_db):
        yield url


@pytest.fixture
async def empty_database_url(pg_server_url: str) -> AsyncIterator[str]:
    """A database with no migration applied, dropped afterwards."""
    async for url in _scratch_database(pg_server_url, None):
        yield url
