"""The embedded PostgreSQL runs with the service's settings, not PostgreSQL's shared-host
defaults."""

from __future__ import annotations

import os
from pathlib import Path

import asyncpg

from api_service.store.embedded import GIB, settings, start_embedded


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
                for name in ("shared_buffers", "random_page_cost", "jit", "max_wal_size")
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
    }
