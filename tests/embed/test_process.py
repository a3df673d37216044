"""`python -m embed_service` as a process: help, serving, graceful stop on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys

import grpc

from memory_proto import embed_pb2, embed_pb2_grpc


def test_help_documents_the_environment() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "embed_service", "--help"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for name in ("EMBED_PORT", "EMBED_BACKEND", "EMBED_MODEL_CACHE_DIR", "EMBED_MAX_QUEUED_TEXTS"):
        assert name in out


async def test_serves_until_sigterm_then_exits_cleanly() -> None:
    env = {**os.environ, "EMBED_BACKEND": "hashing", "EMBED_PORT": "0"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "embed_service", env=env, stderr=asyncio.subprocess.PIPE
    )
    assert process.stderr is not None
    port = None
    async for raw in process.stderr:
        if found := re.search(r"on 127\.0\.0\.1:(\d+)", raw.decode()):
            port = int(found.group(1))
            break
    assert port, "the service never reported its port"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = embed_pb2_grpc.EmbedServiceStub(channel)
        health = await stub.Health(embed_pb2.HealthRequest())
        assert health.ready and health.dim == 768
    process.send_signal(signal.SIGTERM)
    await process.stderr.read()
    assert await process.wait() == 0
