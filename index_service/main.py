"""Process wiring: the gRPC server, its registry and source, start and graceful stop."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import uvloop

from index_service.device import resolve_device
from index_service.native import single_threaded_faiss, single_threaded_numpy_blas
from index_service.rebuild import OrgRows, PostgresSource
from index_service.registry import Registry
from index_service.routing import routing_epoch, shard_for
from index_service.servicer import IndexServicer
from index_service.settings import IndexSettings
from memory_proto import index_pb2_grpc

log = logging.getLogger(__name__)


class EmptySource:
    """The source without a database: every org starts empty."""

    def __init__(self, dim: int) -> None:
        self._dim = dim

    async def load(self, org_id: str) -> OrgRows:
        """No rows."""
        return OrgRows([], [], np.empty((0, self._dim), np.float32), [])


class IndexServer:
    """A running shard: its gRPC server, registry and database source."""

    def __init__(
        self,
        server: grpc.aio.Server,
        port: int,
        registry: Registry,
        servicer: IndexServicer,
        source: PostgresSource | None,
        executors: list[ThreadPoolExecutor],
    ) -> None:
        self._server = server
        self.port = port
        self.registry = registry
        self.servicer = servicer
        self._source = source
        self._executors = executors
        self._preload: asyncio.Task[None] | None = None

    async def stop(self, grace: float = 5.0) -> None:
        """Stop taking requests, let those in flight finish for up to `grace` seconds, then
        release everything."""
        await self._server.stop(grace)
        if self._preload is not None:
            self._preload.cancel()
            await asyncio.gather(self._preload, return_exceptions=True)
        await self.registry.close()
        if self._source is not None:
            await self._source.close()
        for executor in self._executors:
            executor.shutdown(wait=True, cancel_futures=True)

    async def wait_ready(self) -> None:
        """Wait until the orgs this shard owns are loaded."""
        if self._preload is not None:
            await asyncio.shield(self._preload)

    async def _run_preload(self, settings: IndexSettings) -> None:
        try:
            if self._source is not None and settings.shards and settings.shard_name:
                owned = [
                    org
                    for org in await self._source.org_ids()
                    if shard_for(org, settings.shards) == settings.shard_name
                ]
                log.info("loading %d owned orgs", len(owned))
                await self.registry.preload(owned, routing_epoch(settings.shards))
        except Exception:
            log.exception("listing owned orgs failed; orgs will load on first request")
        finally:
            self.servicer.ready = True


async def start_server(settings: IndexSettings) -> IndexServer:
    """Start a shard listening on settings.host:settings.port (0 picks a free port)."""
    if settings.shard_name and settings.shard_name not in settings.shards:
        raise ValueError(f"INDEX_SHARD_NAME {settings.shard_name!r} is not in INDEX_SHARDS")
    device = resolve_device(settings.device)
    single_threaded_faiss()  # small searches and upserts run on this, the event loop's, thread
    cores = os.cpu_count() or 1
    work = ThreadPoolExecutor(max_workers=max(2, cores), thread_name_prefix="index-work")
    requests = ThreadPoolExecutor(
        max_workers=settings.search_threads or cores,
        thread_name_prefix="index-request",
        initializer=single_threaded_faiss,
    )
    source: PostgresSource | None = None
    if settings.database_url:
        source = PostgresSource(settings.database_url, settings.dim, settings.load_batch_rows)
        await source.start()
    else:
        log.warning("no database configured: orgs start empty and are lost on restart")
    registry = Registry(
        source or EmptySource(settings.dim),
        work,
        requests,
        flat_threshold=settings.flat_threshold,
        target_recall=settings.target_recall,
        own_epoch=routing_epoch(settings.shards) if settings.shards else 0,
    )
    servicer = IndexServicer(registry, dim=settings.dim, max_k=settings.max_k, device=device)
    options = [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
    ]
    server = grpc.aio.server(options=options)
    index_pb2_grpc.add_IndexServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"{settings.host}:{settings.port}")
    await server.start()
    shard = IndexServer(server, port, registry, servicer, source, [work, requests])
    shard._preload = asyncio.create_task(shard._run_preload(settings))
    log.info("index_service listening on %s:%d (device %s)", settings.host, port, device)
    return shard


async def _serve(settings: IndexSettings) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    shard = await start_server(settings)
    await stopping.wait()
    log.info("shutting down")
    await shard.stop()


def main() -> None:
    """Run a shard until SIGTERM or SIGINT, then shut down gracefully."""
    logging.basicConfig(
        level=os.environ.get("INDEX_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not single_threaded_numpy_blas():
        log.warning("could not limit numpy's BLAS threads; tail latency may suffer under load")
    # uvloop: with the registry awaiting the request thread's own future, it took the Search
    # path from 0.51 to 0.41 ms (benchmarks/index/search_path.py; the README's figures).
    uvloop.run(_serve(IndexSettings()))
