"""Recall of the IVF index on vectors of real text, against exact search.

Chunks the LongMemEval conversations like the service does (windows of 5 messages, stride 3,
`[role]: content` lines), embeds chunks and questions with the deterministic hashing embedder
(feature hashing of words, 768-d; the real model's vectors are not available on a CPU box in
reasonable time), builds one org's index with a flat threshold low enough to force IVF, and
measures recall@10 of every question against exact search, unfiltered. Writes
results/recall_text.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import numpy as np

from embed_service.hashing import HashingEmbedder
from index_service.org_index import OrgIndex

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "longmemeval"


def chunks_of(messages: list[dict[str, str]]) -> list[str]:
    lines = [f"[{m['role']}]: {m['content']}" for m in messages]
    starts = range(0, max(len(lines) - 2, 1), 3)
    return ["\n".join(lines[s : s + 5]) for s in starts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="LongMemEval folder")
    parser.add_argument(
        "--target-recall", type=float, default=0.97, help="recall@10 the IVF is calibrated to"
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results", help="results folder"
    )
    parser.add_argument(
        "--from-database",
        metavar="URL",
        help="instead: the real model's vectors that a service stored in this PostgreSQL "
        "(chunk_vectors); a random 10%% of them, left out of the index, are the queries",
    )
    args = parser.parse_args()
    if args.from_database:
        measure_stored(args)
        return
    texts: list[str] = []
    for name in ("s150", "oracle"):
        with gzip.open(args.data / f"{name}.conversations.jsonl.gz", "rt") as fh:
            for line in fh:
                texts.extend(chunks_of(json.loads(line)["messages"]))
    questions = [
        json.loads(line)["question"]
        for name in ("s150", "oracle")
        for line in (args.data / f"{name}.questions.jsonl").read_text().splitlines()
    ]
    print(f"{len(texts)} chunks, {len(questions)} questions; embedding", flush=True)
    embedder = HashingEmbedder()
    vectors = np.concatenate(
        [embedder.embed(embedder.tokenize(texts[i : i + 2000])) for i in range(0, len(texts), 2000)]
    ).astype(np.float32)
    queries = embedder.embed(embedder.tokenize(questions)).astype(np.float32)
    measure(
        vectors,
        queries,
        1000,
        args,
        "hashing embedder (768-d) of LongMemEval chunks and questions",
        "recall_text.json",
    )


def measure(
    indexed: np.ndarray,
    queries: np.ndarray,
    flat_threshold: int,
    args: argparse.Namespace,
    description: str,
    out_name: str,
) -> None:
    """Build one org's index over `indexed` (IVF past `flat_threshold`), and write recall@10
    of `queries` against exact search."""
    ids = [f"chk_{i}" for i in range(len(indexed))]
    started = time.perf_counter()
    org = OrgIndex.from_rows(
        ids, ids, indexed, flat_threshold=flat_threshold, target_recall=args.target_recall
    )
    build_s = time.perf_counter() - started
    truth = np.argsort(-(queries @ indexed.T), axis=1)[:, :10]
    hits = 0
    for q, t in zip(queries, truth, strict=True):
        found = {int(h.chunk_id[4:]) for h in org.search(q[None, :], 10, [])}
        hits += len(found & set(t.tolist()))
    result = {
        "vectors": description,
        "chunks": len(indexed),
        "queries": len(queries),
        "index_kind": org.kind,
        "nlist": getattr(org._store, "nlist", None),
        "nprobe": getattr(org._store, "nprobe", None),
        "target_recall": args.target_recall,
        "build_s": build_s,
        "recall_at_10": hits / truth.size,
    }
    print(result, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / out_name).write_text(json.dumps(result, indent=2))


def measure_stored(args: argparse.Namespace) -> None:
    import asyncio

    import asyncpg

    async def load() -> list[bytes]:
        conn = await asyncpg.connect(args.from_database)
        try:
            rows = await conn.fetch(
                "SELECT v.embedding FROM chunks c JOIN chunk_vectors v "
                "USING (org_id, conversation_id, start_sequence, version) ORDER BY c.chunk_id"
            )
            return [bytes(r[0]) for r in rows]
        finally:
            await conn.close()

    raw = asyncio.run(load())
    vectors = np.frombuffer(b"".join(raw), dtype="<f4").reshape(len(raw), -1).astype(np.float32)
    rng = np.random.default_rng(0)
    held_out = rng.random(len(vectors)) < 0.1
    queries, indexed = vectors[held_out], vectors[~held_out]
    measure(
        indexed,
        queries,
        max(100, len(indexed) // 10),
        args,  # a threshold that forces IVF
        "all-mpnet-base-v2 vectors stored by the service (chunk_vectors); "
        "queries are a random 10% of the chunks, left out of the index",
        "recall_model.json",
    )


if __name__ == "__main__":
    main()
