"""What a user would run instead of this service: pgvector HNSW in PostgreSQL, or embedded Chroma.

pgvector runs twice: bare (vectors only), and with the full-text index the service's hybrid
REST search needs (a generated `to_tsvector('english', text)` column and its GIN index), so
the service's ingest can be read against both the least a user could store and what hybrid
search needs stored. Both are searched by vector alone; the one with full text also by a
hybrid statement (hybrid_beside), timed beside the service's REST search.

Each gets the same chunks, vectors and queries as the service, is loaded the way a live system
grows (index first, then rows in batches of 1,000, so every row is indexed on arrival; pgvector
from as many connections as the service has clients, Chroma's embedded client from one), and
is searched one query at a time for the ids of the best 10, as the service's shard is (its
Search answers ids and scores; the service reads the hits' rows apart). The two take turns,
query by query, the shard at the nprobe that finds as much as the alternative's setting
(beside.py): the ratio of their times holds on a machine whose speed drifts.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import resource
import shutil
import struct
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import psutil
from beside import WARMUP, K, ShardProbe, alternate
from cpu import seconds

BATCH = 1_000
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64
# pgvector and Chroma are asked at several ef_search values (pgvector's default is 40,
# Chroma's 100): recall rises with it, so their latency can be read at the recall the service
# reaches.
EF_SEARCH = (40, 100, 200, 400)
# Hybrid search on pgvector with full text, as a user would write it: Supabase's documented
# pattern (each half's best, fused by reciprocal rank in one statement), with what the service's
# REST search uses: each half's best 2 * K (depth), RRF's k of 60, and the best K read with
# their text. The nearest are numbered from an ORDER BY ... LIMIT subquery, the form pgvector
# answers from its index (the pattern numbers them over the whole table). HYBRID_VARIANTS
# name what the full-text half matches and how many of its matches it ranks.
HYBRID_SQL = """
WITH semantic AS (
    SELECT id, row_number() OVER (ORDER BY distance) AS rank
      FROM (SELECT id, embedding <#> $1 AS distance FROM alt_chunks
             ORDER BY embedding <#> $1 LIMIT {depth}) AS nearest
), full_text AS (
    SELECT id, row_number() OVER (ORDER BY ts_rank_cd(text_search, query) DESC) AS rank
      FROM (SELECT id, text_search, query FROM alt_chunks, {tsquery} AS query
             WHERE text_search @@ query {cap}) AS matched
     ORDER BY rank LIMIT {depth}
)
SELECT id, c.text
  FROM semantic FULL OUTER JOIN full_text USING (id) JOIN alt_chunks AS c USING (id)
 ORDER BY coalesce(1.0 / ({rrf_k} + semantic.rank), 0)
          + coalesce(1.0 / ({rrf_k} + full_text.rank), 0) DESC, id
 LIMIT {k}"""
ALL_WORDS = "websearch_to_tsquery('english', {})"  # of the question, the parameter in braces
# The english query's lexemes, or-ed: 'simple' leaves them as they are.
ANY_WORD = "to_tsquery('simple', replace(plainto_tsquery('english', {})::text, '&', '|'))"
# (name, the full-text half's query, the most matches it ranks, the vector half's ef_search:
# None, the least that finds as much as the service). All words, as the pattern has it, also at
# pgvector's default ef_search; any word unbounded, and its first 500 matches only, as the
# service's lexical half ranks at most 500 (its exact plan's cap; org-wide it ranks those of the
# question's rarest words, up to 200 chunks, benchmarks/lexical).
HYBRID_VARIANTS = (
    ("all-words", ALL_WORDS, None, None),
    ("all-words-ef40", ALL_WORDS, None, 40),
    ("any-word-first-500", ANY_WORD, 500, None),
    ("any-word", ANY_WORD, None, None),
)
RRF_K = 60


@dataclass(frozen=True)
class Corpus:
    ids: list[str]  # chunk ids
    conversation_ids: list[str]
    start_sequences: list[int]  # each chunk's first message (evidence.Evidence)
    texts: list[bytes]  # UTF-8: as str, respelt text took 2 bytes a character (10 GB at 1M)
    vectors: np.ndarray  # (n, 768) float32, unit norm


@dataclass(frozen=True)
class AlternativeResult:
    system: str  # "pgvector-hnsw-ef40", "chroma-ef100": the system and its ef_search
    chunks: int
    ingest_seconds: float
    ingest_per_second: float  # chunks/s
    ingest_cpu_ms_per_chunk: float  # CPU of the processes that did the load, by cpu_seconds
    search_p50_ms: float
    search_p99_ms: float
    recall_at_10: float  # by the caller's `recall` of the ids found for each query
    notes: str  # settings used
    # The shard's times, taken query by query beside this system's (ShardBeside.figures).
    beside: dict[str, float] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """The result as one flat row, the shard's times beside it included."""
        fields = asdict(self)
        return {**fields, **fields.pop("beside")}


@dataclass(frozen=True)
class HybridResult:
    system: str  # "pgvector-hnsw-fts-hybrid-any-word": a HYBRID_VARIANTS name
    chunks: int
    ef_search: int  # of the vector half
    search_p50_ms: float  # the hybrid statement, as its client sees it
    search_p99_ms: float
    keyword_share: float  # questions whose full-text half matched any chunk
    rest_p50_ms: float  # the service's REST search beside it, its embedding taken out
    rest_p99_ms: float
    # Shares of the answerable questions whose best 10 hold the answer (evidence.Evidence):
    # the statement's and the REST search's.
    answered: float | None
    rest_answered: float | None
    notes: str

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HybridProbe:
    """What the hybrid statement is timed beside: `rest` asks the service's REST search one
    question and returns its time in seconds, the embedding taken out, and the ids found;
    `questions` in the order of the query vectors; `vector_recall`, the service's vector
    ranking's recall@10, to pick the vector half's ef_search by; `answered`, the share of
    the questions whose best 10 (ids, in order) hold the answer."""

    rest: Callable[[str], Awaitable[tuple[float, list[str]]]]
    questions: list[str]
    vector_recall: float
    answered: Callable[[list[list[str]]], float | None]


def percentiles(samples: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds of latencies in seconds."""
    ms = np.array(samples) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def _result(
    system: str,
    n: int,
    ingest: tuple[float, float],
    samples: list[float],
    recall: float,
    notes: str,
    beside: dict[str, float],
) -> AlternativeResult:
    """`ingest`: the load's (wall, CPU) seconds; `beside`: the shard's times beside these."""
    p50, p99 = percentiles(samples)
    ingest_s, ingest_cpu_s = ingest
    return AlternativeResult(
        system=system,
        chunks=n,
        ingest_seconds=ingest_s,
        ingest_per_second=n / ingest_s,
        ingest_cpu_ms_per_chunk=ingest_cpu_s * 1000 / n,
        search_p50_ms=p50,
        search_p99_ms=p99,
        recall_at_10=recall,
        notes=notes,
        beside=beside,
    )


class _LoadProgress:
    """Reports every 10% of a load with the rate so far: big loads take minutes."""

    def __init__(self, system: str, total: int, progress: Callable[[str], None]) -> None:
        self.system, self.total, self.progress = system, total, progress
        self.next_report = 1
        self.t0 = time.perf_counter()

    def done(self, count: int) -> None:
        if count * 10 >= self.next_report * self.total:
            elapsed = time.perf_counter() - self.t0
            self.progress(
                f"  {self.system}: loaded {count:,}/{self.total:,} "
                f"({count / elapsed:,.0f} chunks/s so far)"
            )
            self.next_report = count * 10 // self.total + 1


async def _vector_connection(pg_url: str, dim: int) -> Any:
    """An asyncpg connection that sends numpy vectors in pgvector's binary format."""
    import asyncpg  # imported here: the Chroma half must not need it

    conn = await asyncpg.connect(pg_url)
    await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    # pgvector's binary wire format: dim, unused, then big-endian float32s.
    header = struct.pack(">HH", dim, 0)
    await conn.set_type_codec(
        "vector",
        encoder=lambda v: header + np.asarray(v, dtype=">f4").tobytes(),
        decoder=lambda b: b,
        format="binary",
    )
    return conn


async def bench_pgvector(
    pg_url: str,
    corpus: Corpus,
    queries: np.ndarray,
    recall: Callable[[list[list[str]]], float],
    progress: Callable[[str], None],
    writers: int,
    cpu_seconds: Callable[[], float],
    probe: ShardProbe,
    full_text: bool = False,
    hybrid: HybridProbe | None = None,
) -> list[AlternativeResult | HybridResult]:
    """pgvector HNSW (inner product on unit vectors, pgvector's default build settings), one
    result per ef_search in EF_SEARCH; with `full_text`, the chunks' English full text is
    indexed too (GIN), as hybrid search needs, and with `hybrid` too, the hybrid statement is
    timed beside the service's REST search (hybrid_beside). `writers` connections load it at
    once, as the service's clients write to it. `cpu_seconds`: cumulative CPU of PostgreSQL
    (all of it: an idle stack's polling on the same server counts too) and this process, the
    client. The shard of `probe` is timed beside each query."""
    n, dim = corpus.vectors.shape
    name = "pgvector-hnsw-fts" if full_text else "pgvector-hnsw"
    conn = await _vector_connection(pg_url, dim)
    try:
        await conn.execute("DROP TABLE IF EXISTS alt_chunks")
        await conn.execute(
            "CREATE TABLE alt_chunks (id text PRIMARY KEY, conversation_id text NOT NULL,"
            f" text text NOT NULL, embedding vector({dim}) NOT NULL)"
        )
        if full_text:
            await conn.execute(
                "ALTER TABLE alt_chunks ADD COLUMN text_search tsvector"
                " GENERATED ALWAYS AS (to_tsvector('english', text)) STORED"
            )
            await conn.execute("CREATE INDEX ON alt_chunks USING gin (text_search)")
        # Before the load, as in a live system: each COPY pays for inserting into the graph.
        await conn.execute(
            "CREATE INDEX ON alt_chunks USING hnsw (embedding vector_ip_ops)"
            f" WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION})"
        )

        report = _LoadProgress(name, n, progress)
        loaded = 0

        async def write(writer: Any, first_batch: int) -> None:
            nonlocal loaded
            ids, convs, texts = corpus.ids, corpus.conversation_ids, corpus.texts
            for start in range(first_batch * BATCH, n, writers * BATCH):
                end = min(start + BATCH, n)
                rows = [
                    (ids[i], convs[i], texts[i].decode(), corpus.vectors[i])
                    for i in range(start, end)
                ]
                await writer.copy_records_to_table(
                    "alt_chunks",
                    records=rows,
                    columns=["id", "conversation_id", "text", "embedding"],
                )
                loaded += end - start
                report.done(loaded)

        connections = [await _vector_connection(pg_url, dim) for _ in range(writers)]
        try:
            # Dirty pages left by earlier work would be written during the load and counted.
            await conn.execute("CHECKPOINT")
            t0, cpu0 = time.perf_counter(), cpu_seconds()
            async with asyncio.TaskGroup() as load:  # one writer failing stops the others
                for w, writer in enumerate(connections):
                    load.create_task(write(writer, w))
            # Read while the writers' backends live: a backend exiting is counted late.
            ingest = (time.perf_counter() - t0, cpu_seconds() - cpu0)
        finally:
            for writer in connections:
                await writer.close()
        # As autovacuum soon would: a table the planner has no statistics for may be read
        # whole instead of through the graph.
        await conn.execute("ANALYZE alt_chunks")

        # <#> is the negated inner product, so ascending order is most similar first; 10 is K.
        # Ids only, as the shard's Search answers (the service reads its rows apart: `rows`).
        query = "SELECT id FROM alt_chunks ORDER BY embedding <#> $1 LIMIT 10"
        plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN {query}", queries[0]))
        if "alt_chunks_embedding_idx" not in plan:
            raise RuntimeError(f"pgvector would not use its HNSW index:\n{plan}")
        stmt = await conn.prepare(query)

        async def ask(q: np.ndarray) -> list[str]:
            return [r["id"] for r in await stmt.fetch(q)]

        results: list[AlternativeResult | HybridResult] = []
        recalls = {}
        for ef_search in EF_SEARCH:
            await conn.execute(f"SET hnsw.ef_search = {ef_search}")
            samples, found_share, beside = await alternate(probe, queries, recall, ask)
            recalls[ef_search] = found_share
            notes = (
                f"hnsw vector_ip_ops m={HNSW_M} ef_construction={HNSW_EF_CONSTRUCTION} "
                f"ef_search={ef_search}; index built before load; {writers} writers, "
                f"COPY batches of {BATCH}" + ("; english full text, GIN" if full_text else "")
            )
            system = f"{name}-ef{ef_search}"
            results.append(_result(system, n, ingest, samples, found_share, notes, beside))
        if full_text and hybrid is not None:
            # The vector half at the least ef_search that finds as much as the service's.
            enough = [ef for ef, found in recalls.items() if found >= hybrid.vector_recall]
            results += await hybrid_beside(
                conn, name, n, queries, hybrid, min(enough, default=EF_SEARCH[-1])
            )
        await conn.execute("DROP TABLE alt_chunks")  # frees the disk; the next run recreates it
    finally:
        await conn.close()
    return results


async def hybrid_beside(
    conn: Any, name: str, n: int, queries: np.ndarray, hybrid: HybridProbe, matched_ef: int
) -> list[HybridResult]:
    """The hybrid statement of each of HYBRID_VARIANTS, taking turns with the service's REST
    search of the same question, each going first every other question (an untimed pass of
    the statement over the questions first, then WARMUP turns untimed), on the loaded
    `alt_chunks` of `conn`; `matched_ef`, the vector half's ef_search where a variant names
    none."""
    results = []
    pairs = list(zip(queries, hybrid.questions, strict=True))
    keyword_shares: dict[str, float] = {}  # by full-text query: two variants share each
    for variant, tsquery, cap, ef in HYBRID_VARIANTS:
        ef_search = ef or matched_ef
        await conn.execute(f"SET hnsw.ef_search = {ef_search}")
        query = HYBRID_SQL.format(
            depth=2 * K,
            tsquery=tsquery.format("$2"),
            cap=f"LIMIT {cap}" if cap else "",
            rrf_k=RRF_K,
            k=K,
        )
        example = (queries[0], hybrid.questions[0])
        plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN {query}", *example))
        # The planner may scan a small table whole for the nearest 20, as it would a user's.
        vector_scan = "hnsw" if "alt_chunks_embedding_idx" in plan else "sequential scan"
        stmt = await conn.prepare(query)
        if tsquery not in keyword_shares:
            matches = await conn.prepare(
                "SELECT EXISTS (SELECT FROM alt_chunks, "  # noqa: S608 (a HYBRID_VARIANTS query)
                f"{tsquery.format('$1')} AS query WHERE text_search @@ query)"
            )
            matched = [await matches.fetchval(question) for question in hybrid.questions]
            keyword_shares[tsquery] = sum(matched) / len(matched)
        # An untimed pass of the statement over every question, as the REST search answered
        # each before (its own timing): both are timed on the pages their questions read.
        for vector, question in pairs:
            await stmt.fetch(vector, question)
        statement_times, rest_times = [], []
        statement_found, rest_found = [], []
        for step, (vector, question) in enumerate(pairs[:WARMUP] + pairs):
            if step % 2:
                rest, rest_ids = await hybrid.rest(question)
            t0 = time.perf_counter()
            rows = await stmt.fetch(vector, question)
            took = time.perf_counter() - t0
            if not step % 2:
                rest, rest_ids = await hybrid.rest(question)
            if step >= WARMUP:
                statement_times.append(took)
                rest_times.append(rest)
                statement_found.append([r["id"] for r in rows])
                rest_found.append(rest_ids)
        p50, p99 = percentiles(statement_times)
        rest_p50, rest_p99 = percentiles(rest_times)
        results.append(
            HybridResult(
                system=f"{name}-hybrid-{variant}",
                chunks=n,
                ef_search=ef_search,
                search_p50_ms=p50,
                search_p99_ms=p99,
                keyword_share=keyword_shares[tsquery],
                rest_p50_ms=rest_p50,
                rest_p99_ms=rest_p99,
                answered=hybrid.answered(statement_found),
                rest_answered=hybrid.answered(rest_found),
                notes=f"each half's best {2 * K}, reciprocal rank fusion (k {RRF_K}), the best "
                f"{K} with their text; full text: {tsquery.format('question')}"
                + (f", its first {cap} matches" if cap else "")
                + f"; vectors: {vector_scan}, ef_search {ef_search}",
            )
        )
    return results


def _chroma_client(folder: Path) -> Any:
    """Chroma's embedded client on `folder`, without telemetry: it would add network calls to
    the timings on a machine without internet."""
    import chromadb  # imported here: heavy, and only this half needs it
    from chromadb.config import Settings

    settings = Settings(anonymized_telemetry=False)
    return chromadb.PersistentClient(path=str(folder), settings=settings)


def _chroma_load(
    folder: Path, corpus: Corpus, progress: Callable[[str], None]
) -> tuple[float, float, int]:
    """Loads the corpus into a new collection: (wall seconds, CPU seconds of this process,
    add batch size)."""
    from chromadb.api.types import Metadata

    n = len(corpus.ids)
    shutil.rmtree(folder, ignore_errors=True)
    client = _chroma_client(folder)
    # The vectors come precomputed; without this Chroma would set up its own ONNX embedder.
    collection = client.create_collection(
        "alt_chunks", metadata={"hnsw:space": "cosine"}, embedding_function=None
    )
    batch = min(BATCH, client.get_max_batch_size())
    report = _LoadProgress("chroma", n, progress)
    me = psutil.Process()
    t0, cpu0 = time.perf_counter(), seconds(me.cpu_times())
    for start in range(0, n, batch):
        end = min(start + batch, n)
        metadatas: list[Metadata] = [
            {"conversation_id": c} for c in corpus.conversation_ids[start:end]
        ]
        collection.add(
            ids=corpus.ids[start:end],
            embeddings=corpus.vectors[start:end],
            documents=[t.decode() for t in corpus.texts[start:end]],
            metadatas=metadatas,
        )
        report.done(end)
    return time.perf_counter() - t0, seconds(me.cpu_times()) - cpu0, batch


def _chroma_search(
    folder: Path,
    queries: np.ndarray,
    ef_search: int,
    probe: ShardProbe,
    recall: Callable[[list[list[str]]], float],
) -> tuple[list[float], float, dict[str, Any], float, dict[str, float]]:
    """Opens the collection at `ef_search` and times each query, taking turns with the shard
    of `probe` (beside.alternate): (latencies in seconds, recall@10, the index's settings, this
    process's peak resident GB, the shard's times)."""
    collection = _chroma_client(folder).get_collection("alt_chunks", embedding_function=None)
    collection.modify(configuration={"hnsw": {"ef_search": ef_search}})
    # A loaded index keeps the ef_search it was opened with: read the folder anew.
    from chromadb.api.shared_system_client import SharedSystemClient

    SharedSystemClient.clear_system_cache()
    collection = _chroma_client(folder).get_collection("alt_chunks", embedding_function=None)
    config = collection.configuration_json.get("hnsw") or {}
    if config.get("ef_search") != ef_search:
        raise RuntimeError(f"Chroma kept ef_search {config.get('ef_search')}, not {ef_search}")

    async def ask(q: np.ndarray) -> list[str]:
        # Ids only, as the shard's Search answers (the service reads its rows apart: `rows`).
        return list(collection.query(query_embeddings=[q], n_results=K, include=[])["ids"][0])

    samples, found_share, beside = asyncio.run(alternate(probe, queries, recall, ask))
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux
    return samples, found_share, config, peak_kb / 2**20, beside


def _in_process(method: Literal["fork", "spawn"], target: Callable[..., Any], *args: Any) -> Any:
    """`target(*args)` in a process of its own, started by `method`, and what it returns.

    Chroma's memory (the loaded index, its caches) goes back to the system only when its
    process ends: loaded and searched in one process, it held both and took 19 GB at 1M."""
    context = multiprocessing.get_context(method)
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_send_result, args=(send, target, *args))
    process.start()
    send.close()  # so that the child's end closing ends a recv() that waits on it
    try:
        failed, value = receive.recv()
    except EOFError:
        process.join()
        raise RuntimeError(
            f"the Chroma process ended (exit code {process.exitcode}) without a result; "
            "-9 is the kernel's OOM killer: a machine with more memory, or a smaller --chroma-max"
        ) from None
    process.join()
    if failed:
        raise RuntimeError(f"the Chroma process failed:\n{value}")
    return value


def _send_result(send: Any, target: Callable[..., Any], *args: Any) -> None:
    try:
        send.send((False, target(*args)))
    except Exception:
        send.send((True, traceback.format_exc()))


def bench_chroma(
    folder: Path,
    corpus: Corpus,
    queries: np.ndarray,
    recall: Callable[[list[list[str]]], float],
    progress: Callable[[str], None],
    probe: ShardProbe,
) -> list[AlternativeResult]:
    """Chroma's embedded PersistentClient with cosine HNSW and its default index settings,
    searched at each of EF_SEARCH (its default is 100).

    Loaded in a forked process (it shares the corpus with this one), then searched at each
    ef_search from a new process, as a service restarted on the folder would be: each reopens
    the collection with that setting. The ingest CPU is the loading process's, where Chroma ran.
    That process also times the shard of `probe` beside each query.
    """
    import chromadb

    n = len(corpus.ids)
    ingest_s, ingest_cpu_s, batch = _in_process("fork", _chroma_load, folder, corpus, progress)
    results = []
    for ef_search in EF_SEARCH:
        progress(f"  chroma: searching at ef_search {ef_search}")
        samples, found_share, config, peak_gb, beside = _in_process(
            "spawn", _chroma_search, folder, queries, ef_search, probe, recall
        )
        notes = (
            f"chromadb {chromadb.__version__} PersistentClient, hnsw space=cosine "
            f"M={config.get('max_neighbors')} ef_construction={config.get('ef_construction')} "
            f"ef_search={ef_search}; add batches of {batch}; loaded in one process, searched "
            f"from another, which peaked at {peak_gb:.1f} GB resident"
        )
        system = f"chroma-ef{ef_search}"
        ingest = (ingest_s, ingest_cpu_s)
        results.append(_result(system, n, ingest, samples, found_share, notes, beside))
    return results
