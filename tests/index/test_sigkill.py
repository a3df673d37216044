"""A real `python -m index_service` killed with SIGKILL answers the same after a restart."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from memory_proto import index_pb2, index_pb2_grpc
from tests.index.helpers import (
    clustered,
    execute,
    hit_tuples,
    insert_chunks,
    search_request,
    upsert_request,
)

ROOT = Path(__file__).resolve().parents[2]
_LISTENING = re.compile(rb"listening on [\d.]+:(\d+)")


@contextlib.asynccontextmanager
async def subprocess_shard(
    database_url: str,
) -> AsyncIterator[tuple[asyncio.subprocess.Process, index_pb2_grpc.IndexServiceStub]]:
    env = {
        **os.environ,
        "INDEX_PORT": "0",
        "INDEX_DATABASE_URL": database_url,
        "INDEX_FLAT_THRESHOLD": "1000",
        "INDEX_LOG_LEVEL": "INFO",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "index_service",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    port = await asyncio.wait_for(_read_port(proc.stderr), timeout=60)
    drain = asyncio.create_task(_drain(proc.stderr))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = index_pb2_grpc.IndexServiceStub(channel)
    try:
        await _until_ready(stub, deadline=time.monotonic() + 60)
        yield proc, stub
    finally:
        await channel.close()
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        await drain


async def _read_port(stream: asyncio.StreamReader) -> int:
    while line := await stream.readline():
        if match := _LISTENING.search(line):
            return int(match.group(1))
    raise RuntimeError("index_service exited before listening")


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def _until_ready(stub: index_pb2_grpc.IndexServiceStub, deadline: float) -> None:
    while True:
        try:
            health = await stub.Health(index_pb2.IndexHealthRequest(), timeout=2)
            if health.ready:
                return
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError("index_service did not become ready")
        await asyncio.sleep(0.05)  # polling a subprocess's readiness, bounded by the deadline


async def _answers(
    stub: index_pb2_grpc.IndexServiceStub, queries: np.ndarray
) -> list[list[tuple[str, str, float]]]:
    out = []
    for org in ("org_small", "org_big"):
        for q in queries:
            out.append(hit_tuples(await stub.Search(search_request(org, q, 10))))
            out.append(hit_tuples(await stub.Search(search_request(org, q, 5, ["conv_3"]))))
    return out


async def test_sigkill_then_restart_gives_identical_results(database_url: str) -> None:
    small = clustered(300, seed=20)
    big = clustered(3000, seed=21)
    await insert_chunks(
        database_url, "org_small", [(f"chk_{i}", f"conv_{i % 9}", small[i]) for i in range(300)]
    )
    await insert_chunks(
        database_url, "org_big", [(f"chk_{i}", f"conv_{i % 9}", big[i]) for i in range(3000)]
    )
    queries = clustered(10, seed=22)
    async with subprocess_shard(database_url) as (proc, stub):
        stats = await stub.Stats(index_pb2.StatsRequest(org_id="org_big"))
        assert stats.index_kind == "ivf"
        # Writes as the indexer makes them: PostgreSQL first, then the shard.
        extra = clustered(1, seed=23)
        await insert_chunks(database_url, "org_small", [("chk_new", "conv_3", extra[0])])
        await stub.Upsert(upsert_request("org_small", [("chk_new", "conv_3", extra[0])]))
        await execute(
            database_url, "DELETE FROM chunks WHERE org_id = 'org_small' AND chunk_id = 'chk_3'"
        )
        await stub.Delete(index_pb2.DeleteRequest(org_id="org_small", chunk_ids=["chk_3"]))
        before = await _answers(stub, np.concatenate([queries, extra]))
        assert any(hit[0] == "chk_new" for hits in before for hit in hits)
        proc.send_signal(signal.SIGKILL)
        assert await proc.wait() == -signal.SIGKILL
    async with subprocess_shard(database_url) as (_, stub):
        after = await _answers(stub, np.concatenate([queries, extra]))
    # Same chunks in the same order; scores equal up to float rounding of the dot products.
    assert [[h[:2] for h in hits] for hits in after] == [[h[:2] for h in hits] for hits in before]
    for hits_after, hits_before in zip(after, before, strict=True):
        assert [h[2] for h in hits_after] == pytest.approx([h[2] for h in hits_before], abs=1e-6)


async def test_sigterm_shuts_down_gracefully(database_url: str) -> None:
    async with subprocess_shard(database_url) as (proc, stub):
        await stub.Health(index_pb2.IndexHealthRequest())
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=30) == 0
