"""Retrieval quality on LongMemEval through the service's public interfaces.

Ingests each conversation of a LongMemEval set with REST (create, then append in batches),
asks each question filtered to its own conversation, and reports recall_any@k and recall_all@k
for k = 1, 3, 5, 10, per category, for three modes:

- mcp:     the MCP `search` tool (cosine ranking of the real model's vectors)
- rest:    REST `GET /api/v1/search` (hybrid: vector and full-text rankings fused)
- lexical: a BM25 baseline over the same 5/3 windows, computed here from the data

An evidence message counts as found when a result's [start_sequence, end_sequence] holds its
sequence. Questions without evidence (abstention) are left out.

Usage:
  python benchmarks/retrieval/run.py --set oracle
  python benchmarks/retrieval/run.py --set s150 --conversations 20
  python benchmarks/retrieval/run.py --base-url http://127.0.0.1:8080 --key cmk_... --set oracle

Without --base-url it starts the whole stack itself (`memctl up`, real model) on its own data
folder, with appends waiting until their chunks are indexed.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import math
import os
import platform
import re
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from api_service.devstack import stack_in_subprocess

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "longmemeval"
KS = (1, 3, 5, 10)
MODES = ("mcp", "rest", "lexical")


def load(
    data: Path, name: str, limit: int | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    conversations = []
    with gzip.open(data / f"{name}.conversations.jsonl.gz", "rt") as lines:
        for line in lines:
            conversations.append(json.loads(line))
            if limit and len(conversations) >= limit:
                break
    keys = {c["conversation_key"] for c in conversations}
    questions = [
        q
        for q in map(json.loads, (data / f"{name}.questions.jsonl").read_text().splitlines())
        if q["conversation_key"] in keys and not q["abstention"] and q["evidence_seqs"]
    ]
    return conversations, questions


# --- lexical baseline --------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")


def windows(messages: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
    """The service's windows (5 messages, stride 3) as (start, end, text)."""
    n = len(messages)
    out = []
    for start in range(1, n + 1, 3):
        end = min(start + 4, n)
        text = "\n".join(f"[{m['role']}]: {m['content']}" for m in messages[start - 1 : end])
        out.append((start, end, text))
    return out


def bm25_rank(query: str, docs: list[str], k1: float = 1.2, b: float = 0.75) -> list[int]:
    tokens = [_WORD.findall(d.lower()) for d in docs]
    avg = sum(map(len, tokens)) / max(1, len(tokens))
    df: Counter[str] = Counter(t for doc in tokens for t in set(doc))
    n = len(docs)
    q = set(_WORD.findall(query.lower()))
    scores = []
    for i, doc in enumerate(tokens):
        tf = Counter(doc)
        score = 0.0
        for term in q & tf.keys():
            idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
            score += idf * tf[term] * (k1 + 1) / (tf[term] + k1 * (1 - b + b * len(doc) / avg))
        scores.append((score, -i))
    return [-i for _, i in sorted(scores, reverse=True)]


# --- the service ---------------------------------------------------------------------------


async def ingest(
    http: httpx.AsyncClient, conversations: list[dict[str, Any]], batch_size: int
) -> dict[str, str]:
    """Store every conversation; return conversation_key -> conversation_id."""
    ids: dict[str, str] = {}
    started = time.perf_counter()
    total = sum(len(c["messages"]) for c in conversations)
    done = 0
    for i, conv in enumerate(conversations, 1):
        r = await http.post(
            "/api/v1/conversations",
            json={
                "title": conv["conversation_key"],
                "metadata": {"dataset": conv["conversation_key"]},
            },
        )
        r.raise_for_status()
        cid = r.json()["conversation_id"]
        messages = conv["messages"]
        for start in range(0, len(messages), batch_size):
            batch = [
                {"role": m["role"], "content": m["content"]}
                for m in messages[start : start + batch_size]
            ]
            r = await http.post(
                "/api/v1/messages", json={"conversation_id": cid, "messages": batch}
            )
            r.raise_for_status()
            done += len(batch)
        ids[conv["conversation_key"]] = cid
        rate = done / (time.perf_counter() - started)
        print(
            f"  ingested {i}/{len(conversations)} conversations, {done}/{total} messages "
            f"({rate:.1f} msg/s, ~{(total - done) / rate / 60:.0f} min left)",
            flush=True,
        )
    return ids


async def stored_ids(http: httpx.AsyncClient) -> dict[str, str]:
    """conversation_key -> conversation_id of conversations a previous run stored (by title)."""
    ids: dict[str, str] = {}
    offset = 0
    while True:
        r = await http.get("/api/v1/conversations", params={"limit": 100, "offset": offset})
        r.raise_for_status()
        page = r.json()["conversations"]
        ids.update({c["title"]: c["id"] for c in page if c["title"]})
        if len(page) < 100:
            return ids
        offset += 100


def found(spans: list[tuple[int, int]], evidence: list[int], k: int) -> tuple[bool, bool]:
    hit = [any(s <= e + 1 <= t for s, t in spans[:k]) for e in evidence]
    return any(hit), all(hit)


async def evaluate(
    base_url: str,
    key: str,
    conversations: list[dict[str, Any]],
    questions: list[dict[str, Any]],
    ids: dict[str, str],
) -> dict[str, Any]:
    by_key = {c["conversation_key"]: c for c in conversations}
    rows = []
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx.AsyncClient(base_url=base_url, headers=headers, timeout=600) as http,
        httpx2.AsyncClient(headers=headers, timeout=600) as http2,
        Client(streamable_http_client(f"{base_url}/mcp", http_client=http2)) as mcp,
    ):
        for i, q in enumerate(questions, 1):
            cid = ids[q["conversation_key"]]
            res = await mcp.call_tool(
                "search",
                {"query": q["question"], "limit": 10, "conversation_id": cid, "snippet_chars": 15},
            )
            assert res.structured_content is not None and not res.is_error, res
            spans = {
                "mcp": [
                    (h["start_sequence"], h["end_sequence"])
                    for h in res.structured_content["results"]
                ]
            }
            r = await http.get(
                "/api/v1/search",
                params={
                    "q": q["question"],
                    "limit": 10,
                    "conversation_id": cid,
                    "snippet_chars": 15,
                },
            )
            r.raise_for_status()
            spans["rest"] = [(h["start_sequence"], h["end_sequence"]) for h in r.json()["results"]]
            wins = windows(by_key[q["conversation_key"]]["messages"])
            order = bm25_rank(q["question"], [w[2] for w in wins])[:10]
            spans["lexical"] = [(wins[j][0], wins[j][1]) for j in order]
            row: dict[str, Any] = {"category": q["category"]}
            for mode in MODES:
                for k in KS:
                    row[f"{mode}_any@{k}"], row[f"{mode}_all@{k}"] = found(
                        spans[mode], q["evidence_seqs"], k
                    )
            rows.append(row)
            if i % 50 == 0 or i == len(questions):
                print(f"  asked {i}/{len(questions)} questions", flush=True)
    return summarize(rows)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row["category"]].append(row)
        groups["all"].append(row)
    out: dict[str, Any] = {}
    for category, members in sorted(groups.items()):
        out[category] = {"questions": len(members)}
        for mode in MODES:
            for k in KS:
                for kind in ("any", "all"):
                    name = f"{mode}_{kind}@{k}"
                    out[category][name] = round(sum(r[name] for r in members) / len(members), 4)
    return out


def plot(results: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    categories = [c for c in results if c != "all"] + ["all"]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    width = 0.27
    for i, mode in enumerate(MODES):
        values = [results[c][f"{mode}_any@5"] for c in categories]
        axes[0].bar(
            [x + (i - 1) * width for x in range(len(categories))], values, width, label=mode
        )
        axes[1].plot(
            KS, [results["all"][f"{mode}_any@{k}"] for k in KS], marker="o", label=f"{mode} any"
        )
        axes[1].plot(
            KS,
            [results["all"][f"{mode}_all@{k}"] for k in KS],
            marker="x",
            linestyle="--",
            label=f"{mode} all",
        )
    axes[0].set_xticks(range(len(categories)), categories, rotation=30, ha="right")
    axes[0].set_ylabel("recall_any@5")
    axes[0].set_ylim(0, 1)
    axes[0].legend()
    axes[0].set_title("recall_any@5 by category")
    axes[1].set_xlabel("k")
    axes[1].set_ylabel("recall")
    axes[1].set_ylim(0, 1)
    axes[1].set_xticks(KS)
    axes[1].legend(fontsize=8)
    axes[1].set_title("recall@k, all questions")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def run(args: argparse.Namespace, base_url: str, key: str) -> None:
    conversations, questions = load(args.data, args.set, args.conversations)
    print(
        f"{args.set}: {len(conversations)} conversations, "
        f"{sum(len(c['messages']) for c in conversations)} messages, "
        f"{len(questions)} questions with evidence",
        flush=True,
    )
    started = time.perf_counter()
    async with httpx.AsyncClient(
        base_url=base_url, timeout=1800, headers={"Authorization": f"Bearer {key}"}
    ) as http:
        if args.reuse:
            ids = await stored_ids(http)
            missing = [
                c["conversation_key"] for c in conversations if c["conversation_key"] not in ids
            ]
            if missing:
                raise SystemExit(
                    f"{len(missing)} conversations are not stored; run without --reuse"
                )
        else:
            ids = await ingest(http, conversations, args.append_batch)
    ingest_s = time.perf_counter() - started
    started = time.perf_counter()
    results = await evaluate(base_url, key, conversations, questions, ids)
    query_s = time.perf_counter() - started
    name = f"{args.set}" + (f"-first{args.conversations}" if args.conversations else "")
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "set": args.set,
        "conversations": len(conversations),
        "messages": sum(len(c["messages"]) for c in conversations),
        "questions": len(questions),
        "machine": args.machine or f"{platform.node()} ({os.cpu_count()} cores, CPU)",
        "ingest_seconds": round(ingest_s, 1),
        "query_seconds": round(query_s, 1),
        "results": results,
    }
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(results, args.out / f"{name}.png", f"LongMemEval {name}: retrieval by mode")
    overall = results["all"]
    for mode in MODES:
        print(f"  {mode:8s} " + "  ".join(f"any@{k}={overall[f'{mode}_any@{k}']:.3f}" for k in KS))
    print(f"wrote {args.out / (name + '.json')} and .png")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("Usage:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--set",
        choices=["oracle", "s150"],
        default="oracle",
        help="oracle: 500 questions, each with only its evidence sessions (default); s150: 150 "
        "questions, each with a haystack of about 50 sessions",
    )
    parser.add_argument("--conversations", type=int, help="only the first N conversations")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LongMemEval folder")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    parser.add_argument("--base-url", help="a running service (default: start one)")
    parser.add_argument("--key", help="API key for --base-url")
    parser.add_argument("--port", type=int, default=8190, help="port for the started stack")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=ROOT / "var" / "bench-retrieval",
        help="data folder of the started stack (its database is reused)",
    )
    parser.add_argument("--machine", help="machine description for the results")
    parser.add_argument("--append-batch", type=int, default=60, help="messages per append call")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="ask again over conversations a previous run stored in --data-dir (no ingest)",
    )
    parser.add_argument(
        "--embedder",
        choices=["transformer", "hashing"],
        default="transformer",
        help="embedding backend of the started stack (hashing: a quick check "
        "of the pipeline, not a quality figure)",
    )
    args = parser.parse_args()
    if args.base_url:
        if not args.key:
            parser.error("--key is required with --base-url")
        asyncio.run(run(args, args.base_url, args.key))
        return
    wait_for_indexing = {  # each append returns once its chunks are indexed
        "MEMORY_APPEND_INDEX_WAIT_SECONDS": "1800",
        "MEMORY_GRPC_TIMEOUT_SECONDS": "600",
    }
    print(f"starting the stack ({args.embedder}); logs in {args.data_dir / 'stack.log'}")
    with stack_in_subprocess(args.data_dir, args.port, args.embedder, wait_for_indexing) as (
        base_url,
        key,
    ):
        asyncio.run(run(args, base_url, key))


if __name__ == "__main__":
    main()
