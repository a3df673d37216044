"""End-to-end benchmark: the whole service, grown to 10k, 100k, 1M chunks in one org, against
what a user would run instead (pgvector HNSW in the same PostgreSQL, Chroma embedded).

Usage: python benchmarks/e2e/run.py [--sizes 10000 100000] [--embedder hashing] [--queries 200]

Starts `memctl up` (embedded PostgreSQL, embed_service, one index shard, api_service) on its
own data folder and grows one org through the public REST API with LongMemEval s150
conversations, repeated under new conversation ids and respelt (see respelt). At each size
it measures:

- growth: messages/s and chunks/s of the appends that reached the size (4 clients, 50
  messages a call; `--growth-batch 500` sends whole conversations, as a bulk import would
  and as the alternatives are loaded, 1,000 rows a call); each append returns once its
  chunks are searchable, or leaves them to the background indexer when appends outpace it;
  the ingest rate (`ingest_chunks_per_s`, compared with the alternatives' loads in
  `ingest_ratios`), counted up to the end of the work the growth left behind (the outbox, the
  term statistics, a rebuild of the org's index), as a load is timed until its last row is
  indexed; and the CPU a chunk cost over the same span, by part: api, embed, index, postgres
  and this process, the load generator (benchmarks/e2e/cpu.py). Past the first size the
  service grows from the size before, where the alternatives load from empty;
- append: latency p50/p99 of one-message appends, one client (searchable on return), with
  short notes (`append_*`) and with a LongMemEval conversation's turns (`append_turn_*`), as the
  client sees it and as the service's own time with the embedding taken out (`own`, below),
  with four of its parts: `write` (the transaction), `embed_wait`, `vectors` (storing them)
  and `index` (the shard's upsert);
- search: REST (hybrid: vectors fused with PostgreSQL full text) and MCP (vectors only)
  latency p50/p99 over LongMemEval questions, one client, org-wide, limit 10; REST also as
  the service's Server-Timing total (`server`, query embedding included) and as its `own`
  time, with two of its parts: `lexical` (the full-text ranking) and `rows` (reading the hits'
  chunk rows); the vector ranking's recall@10 against exact search over the org's stored
  vectors; and the share of the questions whose answer the org holds that each search
  answered (`*_answered`: a LongMemEval evidence message in one of its best 10, in any copy
  of the question's conversation; benchmarks/e2e/evidence.py);
- the vector ranking alone, timed as the alternatives are: the shard's gRPC Search handed
  the query vectors, at its calibrated nprobe and, for an IVF org, at every other its
  calibration could choose (recall against latency);
- the alternatives: the org's chunks, with the vectors the service stored, loaded into
  pgvector (HNSW, in the same PostgreSQL server; bare, and with the full-text index the
  service's hybrid search needs) and Chroma, and asked the same query vectors
  (benchmarks/e2e/alternatives.py) for the ids of the best 10, with the CPU their loads cost
  a chunk. Each alternative setting takes turns, query by query, with the shard at the
  smallest nprobe that finds as much (benchmarks/e2e/beside.py), and is compared with it by
  those times (`ratios` in the JSON, the fifth panel of the plot);
- hybrid search as a user would write it on pgvector with full text (one statement: each
  half's best 20 fused by reciprocal rank, the best 10 read with their text; full text
  matching all of the question's words, or any of them, all its matches ranked or the first
  500), taking turns with the service's REST search of the same question, timed as its
  client sees it with the embedding taken out, and the questions each answered
  (`*-hybrid-*` rows, the last panel).

Before the timed appends and searches it waits for the outbox to drain and the term
statistics to be counted, and vacuums what the growth wrote: the timings are those of a
settled service, not of one still digesting its growth.

With the hashing embedder (the default) embedding costs microseconds, so the figures are the
service's own; `--embedder transformer` runs the real model. Writes results/<label>.json,
.csv and .png, after each size, the JSON with the command, the commit (and any changed
files), the machine and PostgreSQL's and pgvector's versions and cache settings. Its
`samples` hold every timed append's and search's latency in the order taken, to read a tail
from (early calls, or spread).

`own`: the time the request would take if embedding took none, from its Server-Timing parts
(see own_time.without_embedding). The embedding runs beside other work, so subtracting its
whole call would flatter the service.

The REST calls go through aiohttp, not httpx (which the MCP SDK takes, so the MCP calls here
use it). On a 2-core Xeon a call to /healthz took 3.2 ms through httpx, 0.8 through aiohttp
and 0.6 by hand, and a search cost the client 3.8 ms of CPU through httpx against 0.9
(benchmarks/e2e/rest_clients.py). That time was charged to the REST search beside statements
sent by asyncpg, and that CPU taken from the two cores the service runs on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import grpc
import httpx
import numpy as np
from alternatives import (
    AlternativeResult,
    Corpus,
    HybridProbe,
    HybridResult,
    bench_chroma,
    bench_pgvector,
    percentiles,
)
from beside import K, ShardProbe
from corpus import conversations, keyed_conversations
from cpu import BENCHMARK, POSTGRES, CpuMeter, per_chunk_ms
from evidence import Evidence
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from own_time import without_embedding
from report import equal_recall_ratios, ingest_rate, ingest_ratios, plot, shard_curve, write

from api_service import timing
from api_service.devstack import DEV_ORG, add_embedder_option, stack_in_subprocess
from api_service.settings import Limits
from api_service.store import lexical
from api_service.store.embedded import start_embedded
from index_service.routing import routing_epoch
from index_service.stores import NPROBE_STEPS
from memory_proto import embed_pb2, embed_pb2_grpc, index_pb2, index_pb2_grpc

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DATA = ROOT.parent / "shared" / "data" / "longmemeval"
GROWTH_CLIENTS = 4
GROWTH_BATCH = 50
# How often settle() looks whether the growth's work is done (seconds): it counts in the ingest
# rate, so the wait for it to notice must be short.
SETTLE_POLL = 0.2
# Server-Timing parts of an append the benchmark reports on their own, for where its time goes.
APPEND_PARTS = ("write", "embed_wait", "vectors", "index")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Growth:
    """Grows the org through POST /api/v1/messages, `clients` conversations at a time, each
    call `batch` messages; `call_ms` holds every call's latency, `keys` each conversation's
    LongMemEval key."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        data: Path,
        clients: int = GROWTH_CLIENTS,
        batch: int = GROWTH_BATCH,
    ) -> None:
        self._http = http
        self._source = keyed_conversations(data)
        self._clients = clients
        self._batch = batch
        self.chunks = 0
        self.messages = 0
        self.call_ms: list[float] = []
        self.keys: dict[str, str] = {}

    async def to(self, target_chunks: int) -> dict[str, float]:
        start_chunks, start_messages = self.chunks, self.messages
        started = time.perf_counter()
        last_report = started

        async def client() -> None:
            nonlocal last_report
            while self.chunks < target_chunks:
                key, messages = next(self._source)
                cid = await new_conversation(self._http, {})
                self.keys[cid] = key
                for i in range(0, len(messages), self._batch):
                    batch = messages[i : i + self._batch]
                    t0 = time.perf_counter()
                    await post(self._http, cid, batch)
                    self.call_ms.append((time.perf_counter() - t0) * 1000)
                    self.messages += len(batch)
                # One window starts at every third message.
                self.chunks += (len(messages) + 2) // 3
                now = time.perf_counter()
                if now - last_report > 15:
                    last_report = now
                    rate = (self.chunks - start_chunks) / (now - started)
                    left = (target_chunks - self.chunks) / max(rate, 1e-9)
                    progress(
                        f"  {self.chunks:,}/{target_chunks:,} chunks, {rate:,.0f} chunks/s, "
                        f"~{left / 60:.0f} min left"
                    )

        await asyncio.gather(*(client() for _ in range(self._clients)))
        seconds = time.perf_counter() - started
        return {
            "growth_seconds": seconds,
            "growth_messages_per_s": (self.messages - start_messages) / seconds,
            "growth_chunks_per_s": (self.chunks - start_chunks) / seconds,
        }


async def new_conversation(http: aiohttp.ClientSession, body: dict[str, Any]) -> str:
    """A new conversation's id."""
    async with http.post("/api/v1/conversations", json=body) as r:
        r.raise_for_status()
        return str((await r.json())["conversation_id"])


async def post(
    http: aiohttp.ClientSession, cid: str, messages: list[dict[str, str]]
) -> dict[str, float]:
    """Append `messages` to conversation `cid`; its Server-Timing parts (ms)."""
    async with http.post(
        "/api/v1/messages", json={"conversation_id": cid, "messages": messages}
    ) as r:
        await r.read()
        r.raise_for_status()
        return timing.parse(r.headers["server-timing"])


def samples_ms(times: list[float]) -> list[float]:
    """Latencies in seconds as milliseconds, in the order taken, for the results' `samples`
    (a tail is read from them: which calls were slow, early ones or spread)."""
    return [round(t * 1000, 3) for t in times]


async def append_latency(
    http: aiohttp.ClientSession, count: int, messages: list[dict[str, str]], name: str
) -> dict[str, Any]:
    """`count` one-message appends of `messages` in turn (after 10 untimed), one client, into
    a conversation of their own: the whole request as the client sees it, and the service's
    own time with the embedding taken out, as `<name>_...` figures."""
    cid = await new_conversation(http, {"title": f"{name} latency"})
    whole, own = [], []
    parts: dict[str, list[float]] = {part: [] for part in APPEND_PARTS}
    for i in range(count + 10):
        message = messages[i % len(messages)]
        t0 = time.perf_counter()
        timings = await post(http, cid, [message])
        took = time.perf_counter() - t0
        if i >= 10:  # warm-up
            whole.append(took)
            own.append(without_embedding(timings) / 1000)
            for part, times in parts.items():
                times.append(timings.get(part, 0.0) / 1000)
    figures: dict[str, Any] = {
        f"samples_{name}_ms": samples_ms(whole),
        f"samples_{name}_own_ms": samples_ms(own),
    }
    for label, times in [(name, whole), (f"{name}_own", own)] + [
        (f"{name}_{part}", times) for part, times in parts.items()
    ]:
        figures[f"{label}_p50_ms"], figures[f"{label}_p99_ms"] = percentiles(times)
    return figures


async def search_latency(
    base_url: str, key: str, questions: list[str]
) -> tuple[dict[str, Any], list[list[str]], list[list[str]]]:
    """REST and MCP search latency; the MCP (vector) and REST (hybrid) results' ids."""
    headers = {"Authorization": f"Bearer {key}"}
    rest, rest_server, rest_own, mcp_times, found, rest_found = [], [], [], [], [], []
    rest_parts: dict[str, list[float]] = {"lexical": [], "rows": []}
    async with (
        rest_session(base_url, key, timeout=120) as http,
        httpx.AsyncClient(headers=headers, timeout=120) as mcp_http,
        Client(streamable_http_client(f"{base_url}/mcp", http_client=mcp_http)) as mcp,
    ):
        for q in questions[:10]:  # warm-up, of both
            await rest_search(http, q)
            await mcp.call_tool("search", {"query": q, "limit": K})
        for q in questions:
            took, parts, ids = await rest_search(http, q)
            rest_found.append(ids)
            rest.append(took)
            rest_server.append(parts["total"] / 1000)
            rest_own.append(without_embedding(parts) / 1000)
            for name, times in rest_parts.items():
                times.append(parts.get(name, 0.0) / 1000)
        # Apart: right after REST's search of the same question, MCP's would find the shard's
        # lists for it in the caches.
        for q in questions:
            t0 = time.perf_counter()
            res = await mcp.call_tool("search", {"query": q, "limit": K})
            mcp_times.append(time.perf_counter() - t0)
            assert res.structured_content is not None and not res.is_error, res
            found.append([h["chunk_id"] for h in res.structured_content["results"]])
    rest_p50, rest_p99 = percentiles(rest)
    server_p50, server_p99 = percentiles(rest_server)
    own_p50, own_p99 = percentiles(rest_own)
    mcp_p50, mcp_p99 = percentiles(mcp_times)
    figures: dict[str, Any] = {
        "samples_rest_search_ms": samples_ms(rest),
        "samples_rest_search_server_ms": samples_ms(rest_server),
        "samples_rest_search_own_ms": samples_ms(rest_own),
        "samples_mcp_search_ms": samples_ms(mcp_times),
        "rest_search_p50_ms": rest_p50,
        "rest_search_p99_ms": rest_p99,
        "rest_search_server_p50_ms": server_p50,
        "rest_search_server_p99_ms": server_p99,
        "rest_search_own_p50_ms": own_p50,
        "rest_search_own_p99_ms": own_p99,
        "mcp_search_p50_ms": mcp_p50,
        "mcp_search_p99_ms": mcp_p99,
    }
    for name, times in rest_parts.items():  # two of the service's parts, for where time goes
        p50, p99 = percentiles(times)
        figures[f"rest_search_{name}_p50_ms"], figures[f"rest_search_{name}_p99_ms"] = p50, p99
    return figures, found, rest_found


def rest_session(base_url: str, key: str, timeout: float) -> aiohttp.ClientSession:
    """The REST client: an aiohttp session with the org's key."""
    return aiohttp.ClientSession(
        base_url,
        headers={"Authorization": f"Bearer {key}"},
        timeout=aiohttp.ClientTimeout(total=timeout),
    )


async def rest_search(
    http: aiohttp.ClientSession, question: str
) -> tuple[float, dict[str, float], list[str]]:
    """One REST search of `question`, org-wide, limit K: seconds as its client sees them, its
    Server-Timing parts (ms) and the ids of what it found."""
    t0 = time.perf_counter()
    async with http.get("/api/v1/search", params={"q": question, "limit": K}) as r:
        body = await r.read()
    took = time.perf_counter() - t0
    r.raise_for_status()
    ids = [hit["chunk_id"] for hit in json.loads(body)["results"]]
    return took, timing.parse(r.headers["server-timing"]), ids


async def rest_search_without_embedding(
    http: aiohttp.ClientSession, question: str
) -> tuple[float, list[str]]:
    """One REST search of `question`: seconds as its client sees them, less the embedding's
    share of the server's time (own_time.without_embedding), and the ids it found."""
    took, parts, ids = await rest_search(http, question)
    return took - (parts["total"] - without_embedding(parts)) / 1000, ids


async def query_vectors(embed_address: str, questions: list[str]) -> np.ndarray:
    """The questions embedded by the running embed_service as a search embeds them, one a
    call: on a GPU a vector depends slightly on the batch it was computed in, and recall is
    to measure the index, not that."""
    async with grpc.aio.insecure_channel(embed_address) as channel:
        stub = embed_pb2_grpc.EmbedServiceStub(channel)
        out = []
        for question in questions:
            reply = await stub.Embed(embed_pb2.EmbedRequest(texts=[question]), timeout=600)
            out.append(np.frombuffer(reply.vectors, "<f4").reshape(1, reply.dim))
    return np.vstack(out).astype(np.float32)


async def settle(args: argparse.Namespace, pg_url: str, vacuum: bool = True) -> None:
    """Wait until the outbox is empty, the term statistics match the org's size and the
    shard is not rebuilding, then vacuum what the growth wrote, so neither a background
    recount nor autovacuum runs while appends and searches are timed."""
    async with grpc.aio.insecure_channel(args.index_address) as channel:
        shard = index_pb2_grpc.IndexServiceStub(channel)
        while True:  # an IVF rebuild the growth started
            if not (await shard.Stats(index_pb2.StatsRequest(), timeout=60)).building:
                break
            await asyncio.sleep(SETTLE_POLL)
    conn = await asyncpg.connect(pg_url)
    try:
        while True:
            if await conn.fetchval("SELECT count(*) FROM index_outbox") == 0:
                chunks = await conn.fetchval("SELECT count(*) FROM chunks")
                counted = await conn.fetchval("SELECT max(chunks) FROM lexical_stats") or 0
                if chunks < lexical.EXACT_BELOW or not lexical.stats_drifted(chunks, counted):
                    break
            await asyncio.sleep(SETTLE_POLL)
        if vacuum:
            await conn.execute(
                "VACUUM (ANALYZE) chunks, chunk_vectors, messages, conversations, index_outbox"
            )
    finally:
        await conn.close()


async def checkpoint(pg_url: str) -> None:
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()


async def stored_corpus(pg_url: str, with_texts: bool) -> Corpus:
    """Every embedded chunk, with the vector the service stored for it (the stack's database
    holds this one org); the texts only when an alternative is to load them. Read in batches
    into one array: all rows at once held the vectors three times over (9 GB at 1M)."""
    text = "convert_to(c.text, 'UTF8')" if with_texts else "''::bytea"
    query = (
        f"SELECT c.chunk_id, c.conversation_id, c.start_sequence, {text}, v.embedding "  # noqa: S608 (a fixed column)
        "FROM chunks c "
        "JOIN chunk_vectors v USING (org_id, conversation_id, start_sequence, version) "
        "ORDER BY c.chunk_id"
    )
    ids: list[str] = []
    conversation_ids: list[str] = []
    start_sequences: list[int] = []
    texts: list[bytes] = []
    conn = await asyncpg.connect(pg_url)
    try:
        n = await conn.fetchval("SELECT count(*) FROM chunk_vectors")
        dim = await conn.fetchval("SELECT length(embedding) / 4 FROM chunk_vectors LIMIT 1")
        vectors = np.empty((n, dim or 0), dtype=np.float32)
        async with conn.transaction():
            cursor = await conn.cursor(query)
            while rows := await cursor.fetch(20_000):
                start = len(ids)
                ids += [r[0] for r in rows]
                conversation_ids += [r[1] for r in rows]
                start_sequences += [r[2] for r in rows]
                texts += [r[3] for r in rows]
                raw = b"".join(r[4] for r in rows)
                vectors[start : len(ids)] = np.frombuffer(raw, "<f4").reshape(len(rows), -1)
    finally:
        await conn.close()
    return Corpus(ids, conversation_ids, start_sequences, texts, vectors[: len(ids)])


async def shard_probe(
    args: argparse.Namespace, pg_url: str
) -> tuple[ShardProbe, index_pb2.StatsResponse]:
    """The org on the shard, with no recalls yet (shard_search measures them), and the org's
    Stats (its lists and calibrated nprobe)."""
    conn = await asyncpg.connect(pg_url)
    try:
        org_id = await conn.fetchval("SELECT org_id FROM orgs WHERE name = $1", DEV_ORG)
    finally:
        await conn.close()
    epoch = routing_epoch([args.index_address])  # the api's: a different one reloads the org
    async with grpc.aio.insecure_channel(args.index_address) as channel:
        shard = index_pb2_grpc.IndexServiceStub(channel)
        stats = await shard.Stats(index_pb2.StatsRequest(org_id=org_id, routing_epoch=epoch))
    return ShardProbe(args.index_address, org_id, epoch, recalls=()), stats


async def shard_search(
    probe: ShardProbe, stats: index_pb2.StatsResponse, queries: np.ndarray, recall: Recall
) -> dict[str, Any]:
    """The service's vector ranking timed as the alternatives are: handed the query vector,
    one client, over its connection (the shard's gRPC Search; no HTTP, authentication,
    embedding or chunk rows). At the calibrated nprobe, and for an IVF org at each nprobe its
    calibration could choose (NPROBE_STEPS below its lists), for recall against latency: the
    alternatives are compared with the smallest that finds as much as each setting."""
    org_id, epoch = probe.org_id, probe.epoch
    async with grpc.aio.insecure_channel(probe.address) as channel:
        shard = index_pb2_grpc.IndexServiceStub(channel)

        async def timed(nprobe: int) -> tuple[float, float, float]:
            times, found = [], []
            for i, query in enumerate(itertools.chain(queries[:10], queries)):  # 10 warm-up
                request = index_pb2.SearchRequest(
                    org_id=org_id,
                    query=query.astype("<f4").tobytes(),
                    dim=query.size,
                    k=K,
                    routing_epoch=epoch,
                    nprobe=nprobe,
                )
                t0 = time.perf_counter()
                reply = await shard.Search(request, timeout=60)
                if i >= 10:
                    times.append(time.perf_counter() - t0)
                    found.append([h.chunk_id for h in reply.hits])
            return (*percentiles(times), recall(found))

        figures: dict[str, Any] = {"shard_nlist": stats.nlist, "shard_nprobe": stats.nprobe}
        p50, p99, figures["shard_recall_at_10"] = await timed(0)
        figures["shard_search_p50_ms"], figures["shard_search_p99_ms"] = p50, p99
        for nprobe in (n for n in NPROBE_STEPS if n < stats.nlist):
            p50, p99, found_share = await timed(nprobe)
            figures[f"shard_nprobe{nprobe}_p50_ms"] = p50
            figures[f"shard_nprobe{nprobe}_p99_ms"] = p99
            figures[f"shard_nprobe{nprobe}_recall_at_10"] = found_share
    return figures


class Recall:
    """Recall@10 against exact search over the stored vectors, by score: a found chunk is a hit
    if it scores at least the exact 10th best. Equal vectors (a short chunk that no respelling
    touched) tie, and any of them is a right answer. Holds each query's right answers only, so
    it travels to the process that searches Chroma."""

    def __init__(self, corpus: Corpus, queries: np.ndarray) -> None:
        self._answers: list[frozenset[str]] = []
        for start in range(0, len(queries), 32):
            scores = queries[start : start + 32] @ corpus.vectors.T
            kth_best = -np.sort(-scores, axis=1)[:, K - 1]
            for row, floor in zip(scores, kth_best, strict=True):
                right = np.flatnonzero(row >= floor - 1e-5)
                self._answers.append(frozenset(corpus.ids[i] for i in right))

    def __call__(self, found: list[list[str]]) -> float:
        hits = sum(
            len(set(ids[:K]) & right) for ids, right in zip(found, self._answers, strict=True)
        )
        return hits / (K * len(found))


async def measure(
    args: argparse.Namespace,
    base_url: str,
    key: str,
    pg_url: str,
    save: Callable[[list[dict[str, Any]]], None],
) -> list[dict[str, Any]]:
    """Grow, time and compare at each size; `save` the rows so far after each step (a long
    run that fails late keeps what it measured)."""
    lines = (args.data / "s150.questions.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    records = list(itertools.islice(itertools.cycle(records), args.queries))
    questions = [record["question"] for record in records]
    rows: list[dict[str, Any]] = []
    meter = CpuMeter(args.data_dir / "postgres")
    async with rest_session(base_url, key, timeout=1800) as http:
        growth = Growth(http, args.data, batch=args.growth_batch)
        # Appends are timed with short notes, as in earlier runs, and with the turns of a
        # LongMemEval conversation (hundreds to thousands of characters), as agents send them.
        notes = [{"role": "user", "content": f"note {i}"} for i in range(210)]
        turns = next(conversations(args.data))
        for size in sorted(args.sizes):
            progress(f"growing the org to {size:,} chunks")
            row: dict[str, Any] = {"system": "memory-service", "chunks": size}
            await checkpoint(pg_url)  # earlier work's dirty pages are not the growth's
            cpu_before, chunks_before = meter.read(), growth.chunks
            row.update(await growth.to(size))
            # The work the growth leaves behind counts, up to the vacuum: that is the
            # benchmark's, to time a settled service. The ingest rate and the CPU a chunk
            # take it in, as an alternative's load is timed until its last row is indexed.
            settled = time.perf_counter()
            await settle(args, pg_url, vacuum=False)
            row["growth_settle_seconds"] = time.perf_counter() - settled
            row["ingest_chunks_per_s"] = ingest_rate(row)
            progress(
                f"  ingest {row['ingest_chunks_per_s']:,.1f} chunks/s: "
                f"{row['growth_seconds']:,.1f} s of appends, "
                f"{row['growth_settle_seconds']:,.1f} s until the work they left was done"
            )
            cpu = per_chunk_ms(cpu_before, meter.read(), growth.chunks - chunks_before)
            row.update({f"growth_cpu_ms_per_chunk_{part}": ms for part, ms in cpu.items()})
            progress(
                "  CPU a chunk: " + ", ".join(f"{part} {ms:.2f} ms" for part, ms in cpu.items())
            )
            await settle(args, pg_url)  # no recount or backlog under the timed appends
            row.update(await append_latency(http, 200, notes, "append"))
            row.update(await append_latency(http, 200, turns, "append_turn"))
            progress(
                f"  append p50 {row['append_p50_ms']:.1f} ms, "
                f"{row['append_own_p50_ms']:.1f} ms the service's own; with LongMemEval turns "
                f"{row['append_turn_p50_ms']:.1f} and {row['append_turn_own_p50_ms']:.1f} ms"
            )
            await settle(args, pg_url)
            figures, found, rest_found = await search_latency(base_url, key, questions)
            row.update(figures)
            corpus = await stored_corpus(pg_url, with_texts=size <= args.alternatives_max)
            queries = await query_vectors(args.embed_address, questions)
            recall = Recall(corpus, queries)
            row["chunks"] = len(corpus.ids)
            row["recall_at_10"] = recall(found)
            windows = zip(corpus.ids, corpus.conversation_ids, corpus.start_sequences, strict=True)
            evidence = Evidence(records, windows, growth.keys)
            row["answerable_questions"] = evidence.answerable
            row["rest_search_answered"] = evidence(rest_found)
            row["mcp_search_answered"] = evidence(found)
            probe, stats = await shard_probe(args, pg_url)
            row.update(await shard_search(probe, stats, queries, recall))
            probe = replace(probe, recalls=tuple((n, share) for n, _, share in shard_curve(row)))
            shown = {k: v for k, v in row.items() if not k.startswith("samples_")}
            progress(f"  service: {shown}")
            rows.append(row)
            save(rows)
            if size > args.alternatives_max:
                continue
            rest = functools.partial(rest_search_without_embedding, http)
            hybrid = HybridProbe(rest, questions, row["recall_at_10"], evidence)
            compared = alternatives(
                args, size, pg_url, corpus, queries, recall, meter, probe, hybrid
            )
            async for results in compared:
                for result in results:
                    progress(f"  {result}")
                    if isinstance(result, HybridResult):
                        share = result.rest_p50_ms / result.search_p50_ms
                        progress(
                            f"  the REST search took {share:.2f}x the time of "
                            f"{result.system}, timed beside it; answered "
                            f"{_share(result.rest_answered)} against {_share(result.answered)}"
                        )
                    rows.append({**result.row(), "service_chunks": size})
                save(rows)
            for ingest in (r for r in ingest_ratios(rows) if r["service_chunks"] == size):
                progress(
                    f"  ingest: the service {ingest['service_chunks_per_s']:,.1f} chunks/s, "
                    f"{ingest['system']} {ingest['alternative_chunks_per_s']:,.1f} "
                    f"({ingest['service_share']:.2f}x)"
                )
            for ratio in (r for r in equal_recall_ratios(rows) if r["service_chunks"] == size):
                head = f"  {ratio['system']} (recall {ratio['recall_at_10']:.3f}): "
                if ratio["nprobe"] is None:
                    progress(head + "no nprobe timed found as much")
                    continue
                progress(
                    head + f"the shard at nprobe {ratio['nprobe']} (recall "
                    f"{ratio['shard_recall_at_10']:.3f}) took {ratio['shard_share']:.2f}x its "
                    "time, timed beside it"
                )
    return rows


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


async def alternatives(
    args: argparse.Namespace,
    size: int,
    pg_url: str,
    corpus: Corpus,
    queries: np.ndarray,
    recall: Recall,
    meter: CpuMeter,
    probe: ShardProbe,
    hybrid: HybridProbe,
) -> AsyncIterator[list[AlternativeResult | HybridResult]]:
    """Each alternative's results, as each finishes, with the shard of `probe` timed beside
    each of its queries, and pgvector's hybrid statement beside the REST search of `hybrid`."""

    def postgres_and_client() -> float:
        parts = meter.read()
        return parts[POSTGRES] + parts[BENCHMARK]

    for variant in ("pgvector", "pgvector-fts"):
        if variant in args.alternatives:
            yield await bench_pgvector(
                pg_url,
                corpus,
                queries,
                recall,
                progress,
                GROWTH_CLIENTS,
                postgres_and_client,
                probe,
                full_text=variant == "pgvector-fts",
                hybrid=hybrid,
            )
    if "chroma" in args.alternatives and size <= args.chroma_max:
        folder = args.data_dir / "chroma"
        chroma = await asyncio.to_thread(
            bench_chroma, folder, corpus, queries, recall, progress, probe
        )
        shutil.rmtree(folder, ignore_errors=True)
        yield chroma


def source_tree() -> dict[str, Any]:
    """The commit measured, and whether the tree had changes beside it."""

    def git(*words: str) -> str:
        done = subprocess.run(["git", *words], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD"), "changed_files": git("status", "--porcelain")}


def host() -> dict[str, Any]:
    """What the machine has, beside the --machine name given."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
    processor = fields.get("model name", platform.processor() or platform.machine())
    if "cpu family" in fields:
        processor += f", family {fields['cpu family']} model {fields.get('model', '?')}"
    return {
        "processor": processor,
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
    }


async def postgres_setup(pg_url: str) -> dict[str, Any]:
    """The server's version, pgvector's and the settings that size its caches."""
    conn = await asyncpg.connect(pg_url)
    try:
        settings = await conn.fetch(
            "SELECT name, current_setting(name) AS shown FROM pg_settings "
            "WHERE name = ANY($1::text[])",
            ["shared_buffers", "work_mem", "maintenance_work_mem", "effective_cache_size"],
        )
        return {
            "postgres": await conn.fetchval("SHOW server_version"),
            "pgvector": await conn.fetchval(
                "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
            ),
            "postgres_settings": {r["name"]: r["shown"] for r in settings},
        }
    finally:
        await conn.close()


def main() -> None:
    most = Limits().messages_per_append
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("Usage:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[10_000, 100_000],
        help="chunks the org is measured at, in growing order (default: 10000 100000)",
    )
    parser.add_argument("--queries", type=int, default=200, help="search questions per size")
    add_embedder_option(parser)
    parser.add_argument(
        "--alternatives",
        nargs="*",
        default=["pgvector", "pgvector-fts", "chroma"],
        choices=["pgvector", "pgvector-fts", "chroma"],
        help="pgvector-fts: pgvector with the full-text index hybrid search needs",
    )
    parser.add_argument(
        "--alternatives-max", type=int, default=1_000_000, help="largest size to compare at"
    )
    parser.add_argument(
        "--chroma-max",
        type=int,
        default=1_000_000,
        help="largest size to load Chroma at (one writer: 35-45 min per 1M chunks on 2 cores)",
    )
    parser.add_argument(
        "--growth-batch",
        type=int,
        default=GROWTH_BATCH,
        help=f"messages a call while the org grows (the API takes up to {most}; a "
        "conversation holds about 490)",
    )
    parser.add_argument("--data", type=Path, default=DATA, help="LongMemEval folder")
    parser.add_argument("--port", type=int, default=8290, help="port for the started stack")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=ROOT / "var" / "bench-e2e",
        help="the stack's data folder, emptied first",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    parser.add_argument(
        "--machine", default=f"{platform.machine()} CPU", help="names the machine in the results"
    )
    parser.add_argument(
        "--replot", type=Path, help="only redraw the PNG of a results JSON written before"
    )
    args = parser.parse_args()
    if not 1 <= args.growth_batch <= most:
        parser.error(f"--growth-batch must be between 1 and {most}, the API's limit")
    if args.replot:
        results = json.loads(args.replot.read_text())
        title = f"memory service vs alternatives, {results['machine']}"
        plot(results["rows"], args.replot.with_suffix(".png"), title)
        return
    args.embed_address = f"127.0.0.1:{args.port + 1}"
    args.index_address = f"127.0.0.1:{args.port + 2}"
    progress(f"starting the stack ({args.embedder}); logs in {args.data_dir / 'stack.log'}")
    started = time.time()
    machine = re.sub(r"[^a-z0-9]+", "-", args.machine.lower()).strip("-")  # a file name
    label = f"{args.embedder}-{machine}"

    setup = {"command": sys.argv, **source_tree(), **host()}

    def save(rows: list[dict[str, Any]], complete: bool = False) -> None:
        meta = {
            "machine": args.machine,
            "embedder": args.embedder,
            "queries": args.queries,
            "growth_batch": args.growth_batch,
            **setup,
            "minutes": round((time.time() - started) / 60, 1),
            "complete": complete,  # False: a run still going, or one that failed
        }
        write(rows, args.out, label, meta)
        progress(f"wrote {args.out / label}.json, .csv and .png")

    # Every run grows a fresh org.
    with stack_in_subprocess(args.data_dir, args.port, args.embedder, fresh=True) as (
        base_url,
        key,
    ):
        pg_url, server = start_embedded(args.data_dir / "postgres")
        try:
            setup.update(asyncio.run(postgres_setup(pg_url)))
            rows = asyncio.run(measure(args, base_url, key, pg_url, save))
        finally:
            server.cleanup()
    save(rows, complete=True)


if __name__ == "__main__":
    main()
