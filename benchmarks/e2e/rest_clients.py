"""What the HTTP client itself adds to a REST call, by client: httpx, aiohttp and a bare
keep-alive connection that writes the request and reads the response by hand.

The e2e benchmark times REST searches as their client sees them, beside statements that
asyncpg sends, and its load generator shares the two cores with the service: a client that
spends milliseconds of its own on a call shows up in both. This starts the stack (embedded
PostgreSQL, hashing embedder) on its own data folder, grows one org to --chunks through
REST, and then, in rounds that alternate the clients, times one call at a time of
`GET /healthz` (no authentication, no database) and of an org-wide `GET /api/v1/search`
(LongMemEval questions, limit 10). For each it keeps the p50 as the client sees it, for
searches the p50 beyond the server's own Server-Timing total, and the client process's CPU
a call.

Writes results/rest-clients-<machine>.json and .png.

Usage:
  python benchmarks/e2e/rest_clients.py --machine "2-core Intel Xeon" [--chunks 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import numpy as np
from beside import K
from run import DATA, Growth, progress, rest_session, settle

from api_service import timing
from api_service.devstack import stack_in_subprocess
from api_service.store.embedded import start_embedded

HERE = Path(__file__).resolve().parent
CLIENTS = ("httpx", "aiohttp", "bare connection")
# A call returns its Server-Timing total in ms, or None where the route sends none.
Call = Callable[[str], Awaitable[float | None]]


def server_total(value: str | None) -> float | None:
    return None if value is None else timing.parse(value)["total"]


class BareConnection:
    """HTTP/1.1 by hand on one keep-alive connection: the least a client can do."""

    def __init__(self, port: int, key: str) -> None:
        self._port, self._key = port, key
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def open(self) -> None:
        # Opened before each block of calls: the server closes a connection idle for 5 s.
        await self.close()
        self._streams = await asyncio.open_connection("127.0.0.1", self._port)

    async def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None

    async def get(self, path: str) -> float | None:
        assert self._streams is not None
        reader, writer = self._streams
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {self._key}\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        if not lines[0].startswith("HTTP/1.1 200"):
            raise RuntimeError(f"GET {path}: {lines[0]}")
        fields = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
        fields = {name.lower(): value.strip() for name, value in fields.items()}
        await reader.readexactly(int(fields["content-length"]))
        return server_total(fields.get("server-timing"))


async def measure(args: argparse.Namespace, base_url: str, key: str) -> dict[str, Any]:
    port = int(base_url.rsplit(":", 1)[1])
    records = (args.data / "s150.questions.jsonl").read_text().splitlines()
    questions = [json.loads(line)["question"] for line in records][: args.calls]
    requests = {
        "healthz": ["/healthz"] * args.calls,
        "search": [
            "/api/v1/search?" + urlencode({"q": question, "limit": K}) for question in questions
        ],
    }
    async with (
        rest_session(base_url, key, timeout=120) as session,
        httpx.AsyncClient(
            base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120
        ) as hx,
    ):
        progress(f"growing the org to {args.chunks:,} chunks")
        await Growth(session, args.data).to(args.chunks)
        pg_url, server = start_embedded(args.data_dir / "postgres")
        try:
            await settle(argparse.Namespace(index_address=f"127.0.0.1:{port + 2}"), pg_url)
        finally:
            server.cleanup()

        async def with_httpx(path: str) -> float | None:
            r = await hx.get(path)
            r.raise_for_status()
            return server_total(r.headers.get("server-timing"))

        async def with_aiohttp(path: str) -> float | None:
            async with session.get(path) as r:
                await r.read()
                r.raise_for_status()
                return server_total(r.headers.get("server-timing"))

        bare = BareConnection(port, key)
        calls: dict[str, Call] = dict(
            zip(CLIENTS, (with_httpx, with_aiohttp, bare.get), strict=True)
        )
        rounds: dict[str, dict[str, list[dict[str, float]]]] = {
            client: {request: [] for request in requests} for client in CLIENTS
        }
        for number in range(1, args.rounds + 1):
            order = CLIENTS if number % 2 else CLIENTS[::-1]
            for client in order:
                for request, paths in requests.items():
                    await bare.open()
                    for path in paths[:10]:  # warm-up
                        await calls[client](path)
                    rounds[client][request].append(await timed(calls[client], paths))
            await bare.close()
            progress(
                f"round {number}/{args.rounds}: "
                + ", ".join(
                    f"{client} {request} {rounds[client][request][-1]['p50_ms']:.2f} ms"
                    for client in CLIENTS
                    for request in requests
                )
            )
    return {
        "machine": args.machine,
        "chunks": args.chunks,
        "calls": args.calls,
        "median_of_rounds": {
            client: {
                request: {
                    figure: statistics.median(r[figure] for r in taken) for figure in taken[0]
                }
                for request, taken in by_request.items()
            }
            for client, by_request in rounds.items()
        },
        "rounds": rounds,
    }


async def timed(call: Call, paths: list[str]) -> dict[str, float]:
    """p50 of each call as the client sees it and, where the server timed itself, beyond
    its total; the client process's CPU a call (all of it: the event loop's too)."""
    seen, beyond = [], []
    cpu = time.process_time()
    for path in paths:
        t0 = time.perf_counter()
        total = await call(path)
        took = (time.perf_counter() - t0) * 1000
        seen.append(took)
        if total is not None:
            beyond.append(took - total)
    figures = {
        "p50_ms": float(np.percentile(seen, 50)),
        "cpu_ms_per_call": (time.process_time() - cpu) * 1000 / len(paths),
    }
    if beyond:
        figures["beyond_server_p50_ms"] = float(np.percentile(beyond, 50))
    return figures


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    medians = result["median_of_rounds"]
    panels = [
        ("healthz", "p50_ms", "GET /healthz, p50 ms"),
        ("search", "beyond_server_p50_ms", "search: beyond the server's total, p50 ms"),
        ("search", "cpu_ms_per_call", "search: client process CPU a call, ms"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 3.2), sharey=True)
    for ax, (request, figure, title) in zip(axes, panels, strict=True):
        values = [medians[client][request][figure] for client in CLIENTS]
        ax.barh(CLIENTS, values)
        for y, client in enumerate(CLIENTS):
            dots = [r[figure] for r in result["rounds"][client][request]]
            ax.plot(dots, [y] * len(dots), "k.")
        ax.set_title(title, fontsize=9)
    axes[0].invert_yaxis()
    fig.suptitle(
        f"one call at a time, {result['chunks']:,}-chunk org, {result['machine']} "
        "(bars: median of rounds; dots: rounds)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("Usage:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--machine", required=True, help="names the result files")
    parser.add_argument("--chunks", type=int, default=10_000, help="chunks the org grows to")
    parser.add_argument("--calls", type=int, default=150, help="timed calls a round and request")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each timing every client")
    parser.add_argument("--data", type=Path, default=DATA, help="LongMemEval folder")
    parser.add_argument("--port", type=int, default=8390, help="port for the started stack")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=HERE.parents[1] / "var" / "bench-rest-clients",
        help="the stack's data folder, emptied first",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    args = parser.parse_args()

    progress("starting the stack (hashing)")
    with stack_in_subprocess(args.data_dir, args.port, "hashing", fresh=True) as (base, key):
        result = asyncio.run(measure(args, base, key))
    args.out.mkdir(parents=True, exist_ok=True)
    label = re.sub(r"[^a-z0-9]+", "-", args.machine.lower()).strip("-")
    stem = args.out / f"rest-clients-{label}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, stem.with_suffix(".png"))
    progress(f"wrote {stem}.json and .png")


if __name__ == "__main__":
    main()
