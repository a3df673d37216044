"""What TOAST compression costs the rows a chunk writes: pglz against lz4 for window text, full
text and message content (migration 0013), and a vector row compressed or stored as it is
(0012). The full text's read is the one an org-wide lexical search makes of each match.

LongMemEval s150 windows and their messages (the service's 5/3 windows) are parsed once into
staging tables, stored uncompressed; each variant then copies them into a table with the
schema's column storage and the variant's compression, server side (`INSERT ... SELECT`), so
the time is PostgreSQL's reading the staged value, compressing and writing it, not the
client's or the parser's. Reading back decompresses every value: the text's length in
characters (a UTF-8 database), the full text's lexeme count, a vector's first byte. Vectors:
unit vectors with random directions, as a model's (they never compress), and the hashing
embedder's (sparse: they do).

Usage: python benchmarks/store/compression.py [--windows 6000] [--repeats 3]
Database: DATABASE_URL when set (a role that may CHECKPOINT: a superuser or pg_checkpoint;
the benchmark's tables, named bench_compression_*, are dropped at the end), else an embedded
PostgreSQL in a temporary folder, which has pglz only.
Writes results/compression-<label>.json and .png.
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
from pathlib import Path
from typing import Any, NamedTuple

import asyncpg
import numpy as np

from api_service.core import chunking
from embed_service.hashing import HashingEmbedder

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[2] / "shared" / "data" / "longmemeval"
DIM = 768

# Each table as the schema stores it (0008, 0010, 0012): its columns, the value a variant
# compresses, and the storage of its large columns.
TABLES = {
    "chunks": (
        "text text NOT NULL, text_search tsvector NOT NULL",
        "text",
        "ALTER COLUMN text_search SET STORAGE MAIN",
    ),
    "messages": (
        "content text NOT NULL, text_search tsvector NOT NULL",
        "content",
        "ALTER COLUMN text_search SET STORAGE EXTERNAL",
    ),
    "vectors": ("embedding bytea NOT NULL", "embedding", "ALTER COLUMN embedding SET STORAGE MAIN"),
}


class Variant(NamedTuple):
    label: str
    table: str  # a key of TABLES
    method: str  # the compression of the table's value
    full_text: str | None  # the chunks' full text's compression (None: the server's default)
    vectors: str | None  # which vectors: "model" or "hashing"
    whole: bool  # vector rows stored as they are (toast_tuple_target 8160)


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def corpus(data: Path, count: int) -> tuple[list[str], list[str]]:
    """The first `count` s150 windows, and the contents of the messages they hold."""
    texts: list[str] = []
    messages: list[str] = []
    with gzip.open(data / "s150.conversations.jsonl.gz", "rt") as lines:
        for line in lines:
            conversation = [(m["role"], m["content"]) for m in json.loads(line)["messages"]]
            for i, text in enumerate(chunking.window_texts(conversation)):
                texts.append(text)
                # The messages from this window's start to the next's: each message once.
                first = chunking.STRIDE * i
                messages.extend(
                    content for _, content in conversation[first : first + chunking.STRIDE]
                )
                if len(texts) == count:
                    return texts, messages
    return texts, messages


async def stage(conn: asyncpg.Connection, texts: list[str], messages: list[str]) -> None:
    """Uncompressed staging tables, parsed once: the variants copy from them."""
    embedder = HashingEmbedder(dim=DIM)
    hashing = embedder.embed(embedder.tokenize(texts)).astype("<f4")
    rng = np.random.default_rng(0)
    model = rng.standard_normal((len(texts), DIM)).astype("<f4")
    model /= np.linalg.norm(model, axis=1, keepdims=True)
    await conn.execute(
        """CREATE TABLE bench_compression_stage_chunks (id int, text text, text_search tsvector);
           CREATE TABLE bench_compression_stage_messages
               (id int, content text, text_search tsvector);
           CREATE TABLE bench_compression_stage_vectors (id int, kind text, embedding bytea);
           ALTER TABLE bench_compression_stage_chunks
               ALTER COLUMN text SET STORAGE EXTERNAL,
               ALTER COLUMN text_search SET STORAGE EXTERNAL;
           ALTER TABLE bench_compression_stage_messages
               ALTER COLUMN content SET STORAGE EXTERNAL,
               ALTER COLUMN text_search SET STORAGE EXTERNAL;
           ALTER TABLE bench_compression_stage_vectors
               ALTER COLUMN embedding SET STORAGE EXTERNAL"""
    )
    await conn.executemany(
        "INSERT INTO bench_compression_stage_chunks VALUES ($1, $2, to_tsvector('english', $2))",
        list(enumerate(texts)),
    )
    await conn.executemany(
        "INSERT INTO bench_compression_stage_messages VALUES ($1, $2, to_tsvector('english', $2))",
        list(enumerate(messages)),
    )
    await conn.executemany(
        "INSERT INTO bench_compression_stage_vectors VALUES ($1, $2, $3)",
        [(i, "model", v.tobytes()) for i, v in enumerate(model)]
        + [(i, "hashing", v.tobytes()) for i, v in enumerate(hashing)],
    )


async def copy_once(conn: asyncpg.Connection, variant: Variant) -> dict[str, float]:
    """Copy the staged rows into a fresh table compressed as `variant` says; the write's and a
    full read's time, and the bytes a row takes. Every name formatted into the SQL comes from
    VARIANTS and TABLES."""
    table = variant.table
    target = f"bench_compression_{table}"
    columns, value, storage = TABLES[table]
    await conn.execute(
        f"""CREATE TABLE {target} (id int PRIMARY KEY, {columns});
            ALTER TABLE {target} {storage}, ALTER COLUMN {value} SET COMPRESSION {variant.method}"""
    )
    if variant.full_text:
        await conn.execute(
            f"ALTER TABLE {target} ALTER COLUMN text_search SET COMPRESSION {variant.full_text}"
        )
    if variant.whole:
        await conn.execute(f"ALTER TABLE {target} SET (toast_tuple_target = 8160)")
    source = f"bench_compression_stage_{table}"
    where = f"WHERE kind = '{variant.vectors}'" if variant.vectors else ""
    selected = "id, embedding" if variant.vectors else "*"
    started = time.perf_counter()
    rows = await conn.execute(f"INSERT INTO {target} SELECT {selected} FROM {source} {where}")  # noqa: S608
    written = time.perf_counter() - started
    count = int(rows.split()[-1])
    decompressed = f"get_byte({value}, 0)" if table == "vectors" else f"length({value})"
    started = time.perf_counter()
    await conn.fetchval(f"SELECT sum({decompressed}) FROM {target}")  # noqa: S608
    read = time.perf_counter() - started
    size = await conn.fetchval(f"SELECT pg_total_relation_size('{target}')")
    result = {
        "write_us": written * 1e6 / count,
        "read_us": read * 1e6 / count,
        "bytes_a_row": size / count,
        "compressed_share": await _compressed_share(conn, target, value) / count,
    }
    if table == "chunks":  # the full text an org-wide lexical search reads from the row
        started = time.perf_counter()
        await conn.fetchval(f"SELECT sum(length(text_search)) FROM {target}")  # noqa: S608
        result["full_text_read_us"] = (time.perf_counter() - started) * 1e6 / count
        result["full_text_compressed_share"] = (
            await _compressed_share(conn, target, "text_search") / count
        )
    await conn.execute(f"DROP TABLE {target}")
    return result


async def _compressed_share(conn: asyncpg.Connection, table: str, column: str) -> int:
    count: int = await conn.fetchval(
        f"SELECT count(*) FILTER (WHERE pg_column_compression({column}) IS NOT NULL) "  # noqa: S608
        f"FROM {table}"
    )
    return count


VARIANTS = [
    Variant("window text pglz, full text pglz", "chunks", "pglz", "pglz", None, False),
    Variant("window text lz4, full text pglz (0013)", "chunks", "lz4", "pglz", None, False),
    Variant("window text lz4, full text lz4", "chunks", "lz4", "lz4", None, False),
    Variant("message content, pglz", "messages", "pglz", None, None, False),
    Variant("message content, lz4 (0013)", "messages", "lz4", None, None, False),
    Variant("model vector, pglz tried", "vectors", "pglz", None, "model", False),
    Variant("model vector, as it is (0012)", "vectors", "pglz", None, "model", True),
    Variant("hashing vector, pglz", "vectors", "pglz", None, "hashing", False),
    Variant("hashing vector, as it is (0012)", "vectors", "pglz", None, "hashing", True),
]


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    conn = await asyncpg.connect(url)
    try:
        offered = await conn.fetchval(
            "SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'"
        )
        version = await conn.fetchval("SHOW server_version")
        texts, messages = corpus(args.data, args.windows)
        progress(f"staging {len(texts):,} windows and {len(messages):,} messages")
        await stage(conn, texts, messages)
        results = []
        for variant in VARIANTS:
            if not {variant.method, variant.full_text or "pglz"} <= set(offered):
                progress(f"  {variant.label}: skipped, the server has no lz4")
                continue
            await conn.execute("CHECKPOINT")
            runs = [await copy_once(conn, variant) for _ in range(args.repeats)]
            row = {
                "variant": variant.label,
                **{k: statistics.median(r[k] for r in runs) for k in runs[0]},
                "write_us_runs": [round(r["write_us"], 1) for r in runs],
            }
            full_text = (
                f", full text read {row['full_text_read_us']:.1f} us, "
                f"{row['full_text_compressed_share']:.1%} of it compressed"
                if "full_text_read_us" in row
                else ""
            )
            progress(
                f"  {variant.label}: write {row['write_us']:.1f} us a row, "
                f"read {row['read_us']:.1f} us, {row['bytes_a_row']:,.0f} bytes a row, "
                f"{row['compressed_share']:.0%} compressed{full_text}"
            )
            results.append(row)
    finally:
        for table in [*TABLES, *(f"stage_{t}" for t in TABLES)]:
            await conn.execute(f"DROP TABLE IF EXISTS bench_compression_{table}")
        await conn.close()
    return {
        "machine": args.machine,
        "postgres": version,
        "windows": len(texts),
        "messages": len(messages),
        "repeats": args.repeats,
        "results": results,
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    fig, (write, size) = plt.subplots(1, 2, figsize=(11, 0.45 * len(rows) + 1.8), sharey=True)
    labels = [r["variant"] for r in rows]
    write.barh(labels, [r["write_us"] for r in rows], color="tab:blue", label="write")
    write.barh(
        labels,
        [r["read_us"] for r in rows],
        left=[r["write_us"] for r in rows],
        color="tab:orange",
        label="read back",
    )
    write.set_xlabel("µs a row (median of repeats)")
    write.legend(fontsize=8)
    write.invert_yaxis()
    size.barh(labels, [r["bytes_a_row"] / 1024 for r in rows], color="tab:gray")
    size.set_xlabel("KB a row, table with TOAST")
    fig.suptitle(
        f"TOAST compression of a chunk's rows: {report['windows']:,} LongMemEval windows\n"
        f"{report['machine']}, PostgreSQL {report['postgres']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("Usage:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--windows", type=int, default=6000, help="LongMemEval windows to copy")
    parser.add_argument("--repeats", type=int, default=3, help="copies of each variant")
    parser.add_argument("--data", type=Path, default=DATA, help="LongMemEval folder")
    parser.add_argument("--label", default="local", help="results file name: compression-LABEL")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    parser.add_argument(
        "--machine",
        default=f"{platform.machine()} CPU, {os.cpu_count()} cores",
        help="names it in the results",
    )
    args = parser.parse_args()
    database_url = os.environ.get("DATABASE_URL")
    if database_url:
        report = asyncio.run(run(args, database_url))
    else:
        from api_service.store.embedded import start_embedded

        with tempfile.TemporaryDirectory() as tmp:
            url, server = start_embedded(Path(tmp) / "pg")
            try:
                report = asyncio.run(run(args, url))
            finally:
                server.cleanup()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"compression-{args.label}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, stem.with_suffix(".png"))
    progress(f"wrote {stem}.json and .png")


if __name__ == "__main__":
    main()
