"""The org-wide lexical plan against exact BM25: how much of the exact top 10 it finds, and at
what latency, by match budget.

Loads LongMemEval s150 conversations as chunk rows (the service's 5/3 windows), repeated under
new conversation ids up to --chunks, into one org; counts its term statistics; then asks s150
questions org-wide through `lexical.search`, one round trip each: with the org-wide plan, by
budget (the rarest words that fit the budget; when even the rarest word is common, the chunks
holding both of the two rarest first), and exactly, as the reference (BM25 over every chunk
holding a query word; slow on common words).

Overlap@10 compares chunk texts, not ids: repeated conversations make equal chunks, and any
copy is as right as another.

Usage: python benchmarks/lexical/run.py [--chunks 100000] [--questions 150]
       [--budgets 100 200 300 500]
Database: DATABASE_URL when set (the org is deleted afterwards), else an embedded PostgreSQL
in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg

from api_service.core import chunking
from api_service.core.ids import new_id
from api_service.store import admin, lexical
from api_service.store.embedded import start_embedded
from api_service.store.migrate import migrate_url

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[2] / "shared" / "data" / "longmemeval"
K = 10
INT_MAX = 2**31 - 1  # no limit, as a PostgreSQL integer
CHUNK_COLUMNS = ["org_id", "conversation_id", "start_sequence", "chunk_id", "end_sequence", "text"]


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def windows(data: Path) -> Iterator[list[str]]:
    """Each s150 conversation's chunk texts, over and over."""
    while True:
        with gzip.open(data / "s150.conversations.jsonl.gz", "rt") as lines:
            for line in lines:
                messages = json.loads(line)["messages"]
                count = len(messages)
                yield [
                    chunking.chunk_text(
                        (m["role"], m["content"])
                        for m in messages[start - 1 : chunking.window_end(start, count)]
                    )
                    for start in range(1, count + 1, chunking.STRIDE)
                ]


async def seed(conn: asyncpg.Connection, org_id: str, data: Path, size: int) -> int:
    source = windows(data)
    loaded = 0
    while loaded < size:
        texts = next(source)
        cid, count = new_id("conv"), chunking.STRIDE * len(texts)
        await conn.execute(
            "INSERT INTO conversations (org_id, conversation_id, message_count) "
            "VALUES ($1, $2, $3)",
            org_id,
            cid,
            count,
        )
        starts = [1 + chunking.STRIDE * i for i in range(len(texts))]
        await conn.copy_records_to_table(
            "chunks",
            records=[
                (org_id, cid, s, new_id("chk"), chunking.window_end(s, count), t)
                for s, t in zip(starts, texts, strict=True)
            ],
            columns=CHUNK_COLUMNS,
        )
        loaded += len(texts)
        if loaded // 10_000 != (loaded - len(texts)) // 10_000:
            progress(f"  {loaded:,}/{size:,} chunks")
    return loaded


async def ask(
    conn: asyncpg.Connection, org_id: str, question: str, budget: int | None
) -> list[str]:
    """The service's org-wide plan with `budget`; None: exact BM25, every match scored."""
    if budget is None:
        return await lexical.search(
            conn, org_id, question, K, None, exact_below=INT_MAX, exact_cap=INT_MAX
        )
    return await lexical.search(conn, org_id, question, K, None, budget)


async def texts(conn: asyncpg.Connection, org_id: str, ids: list[str]) -> set[str]:
    rows = await conn.fetch(
        "SELECT text FROM chunks WHERE org_id = $1 AND chunk_id = ANY($2::text[])", org_id, ids
    )
    return {r["text"] for r in rows}


async def run(args: argparse.Namespace, database_url: str) -> dict[str, Any]:
    await migrate_url(database_url)
    conn = await asyncpg.connect(database_url)
    server_version = await conn.fetchval("SHOW server_version")
    org_id = new_id("org")
    try:
        await admin.create_org(conn, org_id, new_id("bench-lexical"), None)
        progress(f"loading {args.chunks:,} chunks")
        size = await seed(conn, org_id, args.data, args.chunks)
        progress("counting term statistics")
        await lexical.refresh_stats(conn, org_id)
        await conn.execute("ANALYZE chunks")
        lines = (args.data / "s150.questions.jsonl").read_text().splitlines()
        questions = [json.loads(line)["question"] for line in lines][: args.questions]
        progress(f"exact BM25 for {len(questions)} questions")
        exact = [await texts(conn, org_id, await ask(conn, org_id, q, None)) for q in questions]
        results = []
        for budget in args.budgets:
            for q in questions[:10]:  # warm-up
                await ask(conn, org_id, q, budget)
            overlap, times = [], []
            for q, want in zip(questions, exact, strict=True):
                started = time.perf_counter()
                found = await ask(conn, org_id, q, budget)
                times.append(1000 * (time.perf_counter() - started))
                got = await texts(conn, org_id, found)
                overlap.append(len(got & want) / len(want) if want else 1.0)
            times.sort()
            result = {
                "budget": budget,
                "overlap_at_10": round(statistics.fmean(overlap), 3),
                "p50_ms": round(statistics.median(times), 2),
                "p90_ms": round(times[int(0.9 * (len(times) - 1))], 2),
            }
            progress(f"  {result}")
            results.append(result)
    finally:
        await conn.execute("DELETE FROM orgs WHERE org_id = $1", org_id)
        await conn.close()
    return {
        "machine": args.machine,
        "postgres": server_version,
        "chunks": size,
        "questions": len(questions),
        "results": results,
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = report["results"]
    ax.plot([r["p50_ms"] for r in rows], [r["overlap_at_10"] for r in rows], marker="o")
    for r in rows:
        ax.annotate(
            f"budget {r['budget']}",
            (r["p50_ms"], r["overlap_at_10"]),
            textcoords="offset points",
            xytext=(4, -10),
            fontsize=8,
        )
    ax.set_xlabel("p50 latency, ms (one query, in-process)")
    ax.set_ylabel("overlap@10 with exact BM25")
    ax.set_title(
        f"org-wide lexical plan by match budget\n{report['chunks']:,} chunks, "
        f"{report['machine']}, PostgreSQL {report['postgres']}"
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("Usage:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--chunks", type=int, default=100_000, help="chunks in the org")
    parser.add_argument("--questions", type=int, default=150, help="s150 questions to ask")
    parser.add_argument("--budgets", type=int, nargs="+", default=[100, 200, 300, 500])
    parser.add_argument("--data", type=Path, default=DATA, help="LongMemEval folder")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--machine", default=f"{platform.machine()} CPU, {os.cpu_count()} cores")
    args = parser.parse_args()
    database_url = os.environ.get("DATABASE_URL")
    if database_url:
        report = asyncio.run(run(args, database_url))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            url, server = start_embedded(Path(tmp) / "pg")
            try:
                report = asyncio.run(run(args, url))
            finally:
                server.cleanup()
    args.out.mkdir(parents=True, exist_ok=True)
    label = args.machine.split(",")[0].replace(" ", "-").lower()
    (args.out / f"lexical-{label}.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out / f"lexical-{label}.png")
    progress(f"wrote {args.out / f'lexical-{label}'}.json and .png")


if __name__ == "__main__":
    main()
