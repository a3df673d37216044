"""The api's gRPC channels ping their server while a call is under way: a server whose machine
is gone without closing its connections fails the call in seconds, not at its deadline."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import pytest

from api_service import clients
from embed_service import main as embed_main
from embed_service.batcher import Batcher
from embed_service.settings import EmbedSettings


class FreezingProxy:
    """A TCP proxy on loopback that, once frozen, forwards nothing more either way and
    closes nothing: what a client sees of a server whose machine vanished."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self.frozen = asyncio.Event()
        self.port = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not self.frozen.is_set():
            data = await reader.read(65536)
            if not data or self.frozen.is_set():
                break
            writer.write(data)
            await writer.drain()
        await asyncio.sleep(3600)  # frozen: hold the connection open, silent

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", self._target_port
        )
        for pipe in (self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer)):
            task = asyncio.create_task(pipe)
            self._tasks.add(task)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[FreezingProxy]:
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.mark.parametrize(("keepalive_ms", "failed_by"), [(200, "keepalive"), (None, "deadline")])
async def test_a_call_to_a_vanished_server_fails_at_its_keepalive(
    monkeypatch: pytest.MonkeyPatch, keepalive_ms: int | None, failed_by: str
) -> None:
    """An embedding under way when the path to its server goes silent: with pings every 0.2 s
    answered within 0.5 s it fails in about a second; without them (the control) only at its
    8 s deadline."""
    if keepalive_ms is None:
        monkeypatch.setattr(clients, "KEEPALIVE_MS", 2**31 - 1)  # gRPC's "never"
    else:
        monkeypatch.setattr(clients, "KEEPALIVE_MS", keepalive_ms)
        monkeypatch.setattr(clients, "KEEPALIVE_TIMEOUT_MS", 500)
    embed = Batcher.embed

    async def slow(self: Batcher, texts: Sequence[str]) -> Any:
        await asyncio.sleep(30)
        return await embed(self, texts)

    monkeypatch.setattr(Batcher, "embed", slow)
    server = await embed_main.start_server(EmbedSettings(port=0, backend="hashing"))
    try:
        async with FreezingProxy(server.port).running() as proxy:
            client = clients.EmbedClient(f"127.0.0.1:{proxy.port}", timeout=8)
            try:
                call = asyncio.create_task(client.embed(["a server about to vanish"]))
                await asyncio.sleep(0.5)  # the call is under way
                proxy.frozen.set()
                started = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as failure:
                    await call
                took = time.monotonic() - started
            finally:
                await client.close()
    finally:
        await server.stop(0)
    if failed_by == "keepalive":
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE and took < 4, took
    else:
        assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and took > 6, took
