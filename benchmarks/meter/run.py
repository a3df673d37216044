"""The cost of the usage meter: REST request latency with metering on and off, in one run.

Two api_service processes share one database, one with MEMORY_METERING_ENABLED=false; the
client alternates requests between them in rounds, so both see the same machine load. Each
request lists conversations (auth, meter, one query): the cheapest authenticated request, where
the meter's share of the time is largest.

Usage: python benchmarks/meter/run.py [--requests 3000] [--concurrency 4]
Database: DATABASE_URL when set, else an embedded PostgreSQL in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import httpx

from api_service import auth
from api_service.core.ids import new_id
from api_service.store import admin
from api_service.store.embedded import start_embedded
from api_service.store.migrate import migrate_url

HERE = Path(__file__).resolve().parent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def make_key(database_url: str) -> str:
    await migrate_url(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        org = await admin.create_org(conn, new_id("org"), new_id("bench"), None)
        secret, _ = await auth.issue_key(conn, org.org_id, ["read", "write"], None)
        return secret
    finally:
        await conn.close()


def start_api(database_url: str, port: int, metering: bool) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "MEMORY_PORT": str(port),
        "MEMORY_METERING_ENABLED": "true" if metering else "false",
        "MEMORY_INDEXER_ENABLED": "false",
        "MEMORY_LOG_LEVEL": "WARNING",
    }
    return subprocess.Popen([sys.executable, "-m", "api_service"], env=env)


async def wait_up(url: str) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(300):
            try:
                if (await http.get(f"{url}/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"{url} did not start")


async def measure(
    urls: dict[str, str],
    key: str,
    requests: int,
    concurrency: int,
) -> dict[str, list[float]]:
    latencies: dict[str, list[float]] = {name: [] for name in urls}
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:

        async def one(name: str) -> None:
            start = time.perf_counter()
            r = await http.get(f"{urls[name]}/api/v1/conversations")
            latencies[name].append((time.perf_counter() - start) * 1000)
            r.raise_for_status()

        for name in urls:  # warm-up: connections, caches, the meter's first load
            await asyncio.gather(*(one(name) for _ in range(50)))
            latencies[name].clear()
        rounds = requests // concurrency
        for i in range(rounds):
            order = list(urls) if i % 2 == 0 else list(reversed(urls))
            for name in order:
                await asyncio.gather(*(one(name) for _ in range(concurrency)))
            if (i + 1) % max(1, rounds // 10) == 0:
                print(f"  {i + 1}/{rounds} rounds", flush=True)
    return latencies


def plot(latencies: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, values in latencies.items():
        ordered = sorted(values)
        ax.plot(ordered, [i / len(ordered) for i in range(len(ordered))], label=name)
    ax.set_xlabel("request latency (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("GET /api/v1/conversations: metering on vs off")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def run(args: argparse.Namespace, database_url: str) -> None:
    key = await make_key(database_url)
    procs = {
        "metering on": start_api(database_url, args.port, True),
        "metering off": start_api(database_url, args.port + 1, False),
    }
    urls = {
        "metering on": f"http://127.0.0.1:{args.port}",
        "metering off": f"http://127.0.0.1:{args.port + 1}",
    }
    try:
        for url in urls.values():
            await wait_up(url)
        latencies = await measure(urls, key, args.requests, args.concurrency)
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=30)
    summary = {
        name: {
            "requests": len(values),
            "p50_ms": round(statistics.median(values), 3),
            "p99_ms": round(percentile(values, 0.99), 3),
            "mean_ms": round(statistics.fmean(values), 3),
        }
        for name, values in latencies.items()
    }
    on, off = summary["metering on"], summary["metering off"]
    report = {
        "machine": args.machine or f"{platform.node()} ({os.cpu_count()} cores, CPU)",
        "concurrency": args.concurrency,
        "results": summary,
        "p50_difference_pct": round(100 * (on["p50_ms"] / off["p50_ms"] - 1), 2),
        "p99_difference_pct": round(100 * (on["p99_ms"] / off["p99_ms"] - 1), 2),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "meter.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(latencies, args.out / "meter.png")
    print(json.dumps(report, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="requests per variant")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--port", type=int, default=8290, help="first of two ports")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    parser.add_argument("--machine", help="machine description for the results")
    args = parser.parse_args()
    database_url = os.environ.get("DATABASE_URL")
    if database_url:
        asyncio.run(run(args, database_url))
        return
    with tempfile.TemporaryDirectory() as tmp:
        url, server = start_embedded(Path(tmp) / "pg")
        try:
            asyncio.run(run(args, url))
        finally:
            server.cleanup()


if __name__ == "__main__":
    main()
