"""Process entry: load the model, serve EmbedService over grpc.aio, stop gracefully."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc

from embed_service.backends import batch_limits, load_embedder
from embed_service.batcher import Batcher
from embed_service.embedder import Embedder
from embed_service.servicer import EmbedServicer, RequestLimits
from embed_service.settings import EmbedSettings
from memory_proto import embed_pb2_grpc

log = logging.getLogger(__name__)

# A client connection is closed (GOAWAY) after this long, so that callers resolve the name
# again and spread over embed pods started since: each api pod's channel balances calls over
# the addresses it last resolved, and a rollout would otherwise leave every api pod on the
# pods it found first. Calls under way get the grace to finish (the indexer's deadline is
# two minutes).
MAX_CONNECTION_AGE_MS = 60_000
MAX_CONNECTION_AGE_GRACE_MS = 180_000


@dataclass
class EmbedServer:
    """A running embed service: its bound port, and `stop` to shut it down."""

    port: int
    server: grpc.aio.Server
    servicer: EmbedServicer
    batcher: Batcher

    async def stop(self, grace: float = 5.0) -> None:
        """Report not ready, let calls in flight finish for `grace` seconds, then stop."""
        self.servicer.stop_serving()
        await self.server.stop(grace)
        await self.batcher.close()


async def load_on_a_thread_that_ends(settings: EmbedSettings) -> Embedder:
    """Load the model (and warm it up) on a thread of its own that ends once it is loaded.

    Each thread that runs torch on the CPU keeps an OpenMP team. Once the teams' threads
    outnumber the cores, OpenMP stops spinning between parallel regions and puts its threads
    to sleep, and waking them at each of a forward pass's regions made a question's embedding
    take 30.6 ms instead of 19.6 (p50) on a 2-core Xeon (benchmarks/embed/openmp_teams.py). A
    thread that ends takes its team along, so the batches, on the batcher's one model thread
    on a CPU, have the only one."""
    loader = ThreadPoolExecutor(1, "embed-load")
    try:
        embedder = await asyncio.get_running_loop().run_in_executor(loader, load_embedder, settings)
    except BaseException:
        loader.shutdown(wait=False)  # a load cancelled midway ends in its own time
        raise
    loader.shutdown(wait=True)  # idle: its thread ends at once
    return embedder


async def start_server(settings: EmbedSettings, embedder: Embedder | None = None) -> EmbedServer:
    """Load the model (off the event loop), then bind and start the gRPC server.

    The port is bound only after the model is loaded, so anything that answers is ready.
    `embedder` serves instead of the configured backend when given (one model, many servers).
    """
    if embedder is None:
        embedder = await load_on_a_thread_that_ends(settings)
    batcher = Batcher(embedder, batch_limits(settings, embedder.device))
    batcher.start()
    servicer = EmbedServicer(
        embedder,
        batcher,
        RequestLimits(settings.max_texts_per_call, settings.max_text_chars),
    )
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_message_bytes),
            ("grpc.max_connection_age_ms", MAX_CONNECTION_AGE_MS),
            ("grpc.max_connection_age_grace_ms", MAX_CONNECTION_AGE_GRACE_MS),
        ]
    )
    embed_pb2_grpc.add_EmbedServiceServicer_to_server(servicer, server)
    try:
        port = server.add_insecure_port(f"{settings.host}:{settings.port}")
        await server.start()
    except BaseException:
        await batcher.close()
        raise
    log.info("embed_service %s on %s:%d (%s)", embedder.name, settings.host, port, embedder.device)
    return EmbedServer(port=port, server=server, servicer=servicer, batcher=batcher)


def _env_help() -> str:
    lines = ["environment variables:"]
    for name, info in EmbedSettings.model_fields.items():
        default = "unset" if info.default is None else info.default
        text = f"  EMBED_{name.upper()} (default: {default})"
        if info.description:
            text += f"\n      {info.description}"
        lines.append(text)
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line: configuration comes from the environment, documented in --help."""
    return argparse.ArgumentParser(
        prog="python -m embed_service",
        description="Serve 768-dimension all-mpnet-base-v2 embeddings over gRPC "
        "(memory.v1.EmbedService). Stops gracefully on SIGTERM or SIGINT.",
        epilog=_env_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


async def _serve(settings: EmbedSettings) -> None:
    server = await start_server(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down (grace %.1fs)", settings.shutdown_grace_s)
    await server.stop(settings.shutdown_grace_s)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the service until SIGTERM or SIGINT."""
    build_parser().parse_args(argv)
    settings = EmbedSettings()
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(_serve(settings))
