"""The org-wide lexical plan against exact BM25: how much of the exact top 10 it finds, and at
what latency, by match budget.

Loads LongMemEval s150 conversations as chunk rows (the service's 5/3 windows), repeated under
new conversation ids up to --chunks, into one org; counts its term statistics; then asks s150
questions org-wide through `lexical.search`, one round trip each: with the org-wide plan, by
budget (the rarest words that fit the budget; when even the rarest word is common, the chunks
holding both of the two rarest first), and exactly, as the reference (BM25 over every chunk
holding a query word; slow on common words). With --capped, also the exact plan scoring at
most that many matches, any of them (capped at lexical.EXACT_CAP, it searches a scope of
fewer chunks than that; before 0016, every scope of conversations and every org under 5,000
chunks). With --scoped K, each question is narrowed to K of the org's conversations
(consecutive, from a different one for each question), as a search filtered by
conversation, tags or project is.

Overlap@10 compares chunk texts, not ids: repeated conversations make equal chunks, and any
copy is as right as another.

With --cold, each budget is first timed from disk: the embedded server is restarted (empty
buffers) and its files dropped from the OS page cache, then the questions are asked once
(`cold_p50_ms`); the usual timing (`p50_ms`) follows with the pages the first pass read.
Without it every pass follows the exact reference, which has read each question's matches.

With --full-text-storage external the chunks' full text is stored out of line (TOAST), as
before migration 0010, to compare with its place in the row (main, the schema's).

Usage: python benchmarks/lexical/run.py [--chunks 100000] [--questions 150]
       [--budgets 100 200 300 500] [--capped 500] [--scoped 30] [--cold]
       [--full-text-storage main|external]
Database: DATABASE_URL when set (the org is deleted afterwards), else an embedded PostgreSQL
in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
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
                yield chunking.window_texts([(m["role"], m["content"]) for m in messages])


async def seed(
    conn: asyncpg.Connection, org_id: str, data: Path, size: int
) -> tuple[int, list[str]]:
    """Conversations of s150 windows up to `size` chunks: the chunks loaded, and the
    conversations' ids in order."""
    source = windows(data)
    loaded, ids = 0, []
    while loaded < size:
        texts = next(source)
        cid, count = new_id("conv"), chunking.STRIDE * len(texts)
        ids.append(cid)
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
    return loaded, ids


async def load_org(
    conn: asyncpg.Connection, org_id: str, name: str, data: Path, chunks: int
) -> tuple[int, list[str]]:
    """Create org `org_id` with about `chunks` chunks (seed), its term statistics counted and
    the table analyzed: the chunks loaded, and its conversations' ids in order."""
    await admin.create_org(conn, org_id, new_id(name), None)
    progress(f"loading {chunks:,} chunks")
    loaded = await seed(conn, org_id, data, chunks)
    progress("counting term statistics")
    await lexical.refresh_stats(conn, org_id)
    await conn.execute("ANALYZE chunks")
    return loaded


# A question and the conversations it is narrowed to (None: org-wide).
Question = tuple[str, list[str] | None]


def questions_asked(
    data: Path, count: int, scoped: int, conversations: list[str]
) -> list[Question]:
    """The first `count` s150 questions, each narrowed to `scoped` of the org's conversations
    (consecutive, from a different one for each question), or org-wide when `scoped` is 0."""
    lines = (data / "s150.questions.jsonl").read_text().splitlines()
    texts_asked = [json.loads(line)["question"] for line in lines][:count]
    if not scoped:
        return [(text, None) for text in texts_asked]
    ring = conversations * 2  # a scope may wrap around the org's conversations
    return [(text, ring[i % len(conversations) :][:scoped]) for i, text in enumerate(texts_asked)]


# How a search is planned: `lexical.search`'s keyword arguments.
Plan = dict[str, int]
EXACT: Plan = {"exact_below": INT_MAX, "exact_cap": INT_MAX}  # every match scored


def org_wide(budget: int) -> Plan:
    return {"budget": budget, "exact_below": 0}


def capped(cap: int) -> Plan:
    return {"exact_below": INT_MAX, "exact_cap": cap}


async def ask(conn: asyncpg.Connection, org_id: str, question: Question, plan: Plan) -> list[str]:
    text, scope = question
    return await lexical.search(conn, org_id, text, K, scope, **plan)


async def texts(conn: asyncpg.Connection, org_id: str, ids: list[str]) -> set[str]:
    rows = await conn.fetch(
        "SELECT text FROM chunks WHERE org_id = $1 AND chunk_id = ANY($2::text[])", org_id, ids
    )
    return {r["text"] for r in rows}


def restart_cold(server: Any) -> None:
    """Restart the embedded server with empty buffers and its files out of the OS page cache,
    so the next queries read from disk."""
    server.stop()
    for path in Path(server.pgdata).rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    server.start()


async def timed(
    conn: asyncpg.Connection, org_id: str, questions: list[Question], plan: Plan
) -> tuple[list[float], list[list[str]]]:
    """Each question's latency in ms, and what it found."""
    times, found = [], []
    for q in questions:
        started = time.perf_counter()
        found.append(await ask(conn, org_id, q, plan))
        times.append(1000 * (time.perf_counter() - started))
    return times, found


def percentiles(times: list[float]) -> tuple[float, float, float]:
    """p50, p90 and p99, in ms."""
    ordered = sorted(times)
    at = [ordered[int(share * (len(ordered) - 1))] for share in (0.9, 0.99)]
    return round(statistics.median(ordered), 2), round(at[0], 2), round(at[1], 2)


async def run(
    args: argparse.Namespace, database_url: str, cold: Callable[[], None] | None = None
) -> dict[str, Any]:
    """`cold`: restarts the server out of every cache (restart_cold), for --cold."""
    await migrate_url(database_url)
    conn = await asyncpg.connect(database_url)
    server_version = await conn.fetchval("SHOW server_version")
    if args.full_text_storage:
        await conn.execute(
            f"ALTER TABLE chunks ALTER COLUMN text_search SET STORAGE {args.full_text_storage}"
        )
    storage = await conn.fetchval(
        "SELECT attstorage::text FROM pg_attribute "
        "WHERE attrelid = 'chunks'::regclass AND attname = 'text_search'"
    )
    org_id = new_id("org")
    try:
        size, conversations = await load_org(conn, org_id, "bench-lexical", args.data, args.chunks)
        questions = questions_asked(args.data, args.questions, args.scoped or 0, conversations)
        exact: list[set[str]] | None = None
        if args.exact:
            progress(f"exact BM25 for {len(questions)} questions")
            exact = [
                await texts(conn, org_id, await ask(conn, org_id, q, EXACT)) for q in questions
            ]
        plans = [({"budget": b}, org_wide(b)) for b in args.budgets]
        plans += [({"exact_cap": c}, capped(c)) for c in args.capped]
        results = []
        for named, plan in plans:
            result: dict[str, Any] = dict(named)
            if cold is not None:
                await conn.close()
                await asyncio.to_thread(cold)
                conn = await asyncpg.connect(database_url)
                times, _ = await timed(conn, org_id, questions, plan)
                from_disk = percentiles(times)
                result["cold_p50_ms"], result["cold_p90_ms"], result["cold_p99_ms"] = from_disk
            else:
                await timed(conn, org_id, questions[:10], plan)  # warm-up
            times, found = await timed(conn, org_id, questions, plan)
            if exact is not None:
                overlap = []
                for ids, want in zip(found, exact, strict=True):
                    got = await texts(conn, org_id, ids)
                    overlap.append(len(got & want) / len(want) if want else 1.0)
                result["overlap_at_10"] = round(statistics.fmean(overlap), 3)
            result["p50_ms"], result["p90_ms"], result["p99_ms"] = percentiles(times)
            progress(f"  {result}")
            results.append(result)
    finally:
        if not conn.is_closed():  # else the server did not come back (--cold): its error tells
            await conn.execute("DELETE FROM orgs WHERE org_id = $1", org_id)
            await conn.close()
    return {
        "machine": args.machine,
        "postgres": server_version,
        "chunks": size,
        "full_text_storage": {"m": "main", "e": "external"}.get(storage, storage),
        "questions": len(questions),
        "scoped_to_conversations": args.scoped,
        "results": results,
    }


@contextlib.contextmanager
def database() -> Iterator[tuple[str, Any]]:
    """(URL, embedded server): DATABASE_URL when set, with no server, else an embedded
    PostgreSQL in a temporary folder, removed afterwards."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url, None
        return
    with tempfile.TemporaryDirectory() as tmp:
        url, server = start_embedded(Path(tmp) / "pg")
        try:
            yield url, server
        finally:
            server.cleanup()


def add_output_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """--label, --data, --out and --machine, as this folder's benchmarks take them."""
    parser.add_argument("--label", help=f"results file name: {name}-LABEL.json and .png")
    parser.add_argument("--data", type=Path, default=DATA, help="LongMemEval folder")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    parser.add_argument(
        "--machine",
        default=f"{platform.machine()} CPU, {os.cpu_count()} cores",
        help="names it in the results",
    )


def save(
    report: dict[str, Any],
    args: argparse.Namespace,
    name: str,
    plot: Callable[[dict[str, Any], Path], None],
) -> None:
    """Write `report` as NAME-LABEL.json in --out and plot it beside it as .png."""
    args.out.mkdir(parents=True, exist_ok=True)
    label = args.label or args.machine.split(",")[0].replace(" ", "-").lower()
    stem = args.out / f"{name}-{label}"
    Path(f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, Path(f"{stem}.png"))
    progress(f"wrote {stem}.json and .png")


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = [r for r in report["results"] if "budget" in r]
    capped_rows = [r for r in report["results"] if "exact_cap" in r]
    series = [("p50_ms", "pages in buffers")]
    if all("cold_p50_ms" in r for r in rows):
        series.append(("cold_p50_ms", "pages from disk"))
    if all("overlap_at_10" in r for r in report["results"]):
        for key, label in series:
            ax.plot([r[key] for r in rows], [r["overlap_at_10"] for r in rows], "o-", label=label)
            for r in capped_rows:
                ax.plot(r[key], r["overlap_at_10"], "rx")
        for r in report["results"]:
            ax.annotate(
                f"budget {r['budget']}" if "budget" in r else f"exact, any {r['exact_cap']}",
                (r["p50_ms"], r["overlap_at_10"]),
                textcoords="offset points",
                xytext=(4, -10),
                fontsize=8,
            )
        ax.set_xlabel("p50 latency, ms (one query, in-process)")
        ax.set_ylabel("overlap@10 with exact BM25")
    else:  # --no-exact
        for key, label in series:
            ax.plot([r["budget"] for r in rows], [r[key] for r in rows], "o-", label=label)
        ax.set_xlabel("match budget")
        ax.set_ylabel("p50 latency, ms (one query, in-process)")
    ax.legend(fontsize=8)
    scoped = report.get("scoped_to_conversations")
    within = f" (each search within {scoped} conversations)" if scoped else ""
    ax.set_title(
        f"org-wide lexical plan by match budget\n{report['chunks']:,} chunks{within}, "
        f"{report['machine']}, PostgreSQL {report['postgres']}, "
        f"full text {report.get('full_text_storage', 'external')}"
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
    parser.add_argument(
        "--budgets",
        type=int,
        nargs="+",
        default=[100, 200, 300, 500],
        help="match budgets of the org-wide plan, each timed",
    )
    parser.add_argument(
        "--capped",
        type=int,
        nargs="*",
        default=[],
        help="also time the exact plan scoring at most this many matches (any of them)",
    )
    parser.add_argument(
        "--scoped",
        type=int,
        metavar="K",
        help="narrow each question to K of the org's conversations (default: org-wide)",
    )
    parser.add_argument(
        "--cold", action="store_true", help="also time each budget from disk (embedded server)"
    )
    parser.add_argument(
        "--no-exact",
        dest="exact",
        action="store_false",
        help="skip the exact reference and overlap@10 (it reads every match: most of a 1M org)",
    )
    parser.add_argument(
        "--full-text-storage",
        choices=["main", "external"],
        help="store the chunks' full text in the row (main) or out of line (external, as "
        "before 0010); embedded server only",
    )
    add_output_arguments(parser, "lexical")
    args = parser.parse_args()
    if os.environ.get("DATABASE_URL"):
        if args.cold:
            parser.error("--cold restarts the embedded server: unset DATABASE_URL to use it")
        if args.full_text_storage:
            parser.error("--full-text-storage alters the schema: unset DATABASE_URL to use it")
    with database() as (url, server):
        cold = (lambda: restart_cold(server)) if args.cold else None
        report = asyncio.run(run(args, url, cold))
    save(report, args, "lexical", plot)


if __name__ == "__main__":
    main()
