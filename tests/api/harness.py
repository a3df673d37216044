"""A running service for tests: embed_service (hashing backend) and index_service as real gRPC
servers on loopback, api_service under uvicorn on a free port, keys created through the admin
code, and clients for both interfaces (httpx for REST, the MCP SDK's Streamable HTTP client)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from api_service import auth
from api_service.core.ids import new_id
from api_service.main import create_app
from api_service.settings import ApiSettings
from api_service.store import admin
from embed_service.main import EmbedServer
from embed_service.main import start_server as start_embed
from embed_service.settings import EmbedSettings
from index_service.main import IndexServer
from index_service.main import start_server as start_index
from index_service.settings import IndexSettings
from index_service.stores import SCORE_TOLERANCE

# A text's own vector scores cosine 1, within the tolerance of the shard's float16 codes; the
# vector of any other text (an older version of a window, say) scores clearly less.
COSINE_1 = pytest.approx(1.0, abs=SCORE_TOLERANCE)


@dataclass
class Service:
    base_url: str
    database_url: str
    settings: ApiSettings
    # In-process servers, which a test can stop and start; None when they run elsewhere.
    embed: EmbedServer | None = None
    index: IndexServer | None = None

    async def stop_embed(self) -> None:
        assert self.embed is not None
        await self.embed.stop(0)

    async def start_embed(self) -> None:
        """Start embed_service again on the address the API was given."""
        port = int(self.settings.embed_address.rsplit(":", 1)[1])
        self.embed = await start_embed(EmbedSettings(port=port, backend="hashing"))

    async def outbox_size(self) -> int:
        conn = await asyncpg.connect(self.database_url)
        try:
            count: int = await conn.fetchval("SELECT count(*) FROM index_outbox")
            return count
        finally:
            await conn.close()

    async def org_with_key(
        self, scopes: tuple[str, ...] = ("read", "write"), expires_in_days: float | None = None
    ) -> tuple[str, str]:
        """A new org and a key for it: (org_id, secret)."""
        conn = await asyncpg.connect(self.database_url)
        try:
            org = await admin.create_org(conn, new_id("org"), new_id("name"), None)
            secret, _ = await auth.issue_key(conn, org.org_id, list(scopes), expires_in_days)
            return org.org_id, secret
        finally:
            await conn.close()

    async def key_for(self, org_id: str, scopes: tuple[str, ...] = ("read", "write")) -> str:
        conn = await asyncpg.connect(self.database_url)
        try:
            secret, _ = await auth.issue_key(conn, org_id, list(scopes), None)
            return secret
        finally:
            await conn.close()

    async def expire_key(self, secret: str) -> None:
        conn = await asyncpg.connect(self.database_url)
        try:
            await conn.execute(
                "UPDATE api_keys SET expires_at = $2 WHERE key_hash = $1",
                auth.hash_key(secret),
                datetime.now(UTC) - timedelta(seconds=1),
            )
        finally:
            await conn.close()

    async def revoke_key(self, secret: str) -> None:
        conn = await asyncpg.connect(self.database_url)
        try:
            await conn.execute(
                "UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1", auth.hash_key(secret)
            )
        finally:
            await conn.close()

    def rest(self, key: str | None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=30)

    @contextlib.asynccontextmanager
    async def mcp(self, key: str, **headers: str) -> AsyncIterator[McpCaller]:
        """An MCP client with `key`, sending `headers` (Host, Origin) besides."""
        headers["Authorization"] = f"Bearer {key}"
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            Client(streamable_http_client(f"{self.base_url}/mcp", http_client=http)) as client,
        ):
            yield McpCaller(client)


@dataclass
class McpCaller:
    client: Client

    async def call(self, tool: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
        """(is_error, payload); checks the text content carries the same object."""
        result = await self.client.call_tool(tool, arguments)
        payload = result.structured_content
        assert payload is not None
        assert json.loads(result.content[0].text) == payload  # type: ignore[union-attr]
        return bool(result.is_error), payload

    async def ok(self, tool: str, **arguments: Any) -> dict[str, Any]:
        is_error, payload = await self.call(tool, **arguments)
        assert not is_error, payload
        return payload

    async def error(self, tool: str, **arguments: Any) -> str:
        is_error, payload = await self.call(tool, **arguments)
        assert is_error, payload
        assert set(payload) == {"error"}
        message: str = payload["error"]
        return message


@contextlib.asynccontextmanager
async def running_service(database_url: str, **overrides: Any) -> AsyncIterator[Service]:
    service: Service | None = None
    embed = await start_embed(EmbedSettings(port=0, backend="hashing"))
    index = await start_index(IndexSettings(port=0, database_url=database_url))
    overrides.setdefault("auth_failures_per_minute", 10_000)  # tests fail auth on purpose
    settings = ApiSettings(
        database_url=database_url,
        embed_address=f"127.0.0.1:{embed.port}",
        index_shards=[f"127.0.0.1:{index.port}"],
        **overrides,
    )
    try:
        async with serve(settings) as base_url:
            service = Service(base_url, database_url, settings, embed, index)
            yield service
    finally:
        await index.stop(0)
        await (service.embed if service else embed).stop(0)


async def say(http: httpx.AsyncClient, conversation_id: str, content: str) -> httpx.Response:
    """Append one user message to a conversation over REST."""
    return await http.post(
        "/api/v1/messages",
        json={
            "conversation_id": conversation_id,
            "messages": [{"role": "user", "content": content}],
        },
    )


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float = 3.0) -> bool:
    """Whether `check` comes true within `seconds`, for what happens in the background (an
    announcement from PostgreSQL, a worker's next round)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def outbox_gauges(metrics: str) -> dict[str, float]:
    """The index outbox's gauges in a /metrics text, by name."""
    lines = (line.split() for line in metrics.splitlines())
    return {
        line[0]: float(line[1])
        for line in lines
        if line and line[0].startswith("memory_index_outbox_")
    }


async def outbox_drained(database_url: str, deadline_s: float = 60) -> None:
    """Wait until the indexer has done every outbox job (there is no event to await)."""
    conn = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + deadline_s
        while await conn.fetchval("SELECT count(*) FROM index_outbox"):
            if time.monotonic() > deadline:
                raise TimeoutError("the outbox did not drain")
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def serve(settings: ApiSettings) -> AsyncIterator[str]:
    """api_service under uvicorn on a free loopback port; yields its base URL."""
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=0, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
