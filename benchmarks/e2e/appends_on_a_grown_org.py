"""Appends and searches on an org the end-to-end benchmark grew, while it keeps growing: the
tail an append gets when it finds the full-text index's pending list full, and what the list
costs a search.

Usage: python benchmarks/e2e/appends_on_a_grown_org.py [--chunks 3000] [--rounds 2]

Starts the stack on the data folder a run of benchmarks/e2e/run.py left (`--data-dir`, grown to
1M chunks with `--sizes ... 1000000`), vacuums the chunks, asks the LongMemEval questions twice
over REST (the first pass warms the buffers), then, each round, appends `--chunks` chunks with
one client, 50 messages a call, and asks the questions again. Writes results/<--out>.json with
each round's append latency (p50, p99, max) and the full-text ranking's (Server-Timing
`lexical`) p50/p99 of each pass, and a PNG of both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import numpy as np
from run import DATA, HERE, ROOT, Growth, progress

from api_service import timing
from api_service.devstack import stack_in_subprocess
from api_service.store.embedded import start_embedded


async def search_pass(http: httpx.AsyncClient, questions: list[str]) -> dict[str, float]:
    lexical = []
    for question in questions:
        r = await http.get("/api/v1/search", params={"q": question, "limit": 10})
        r.raise_for_status()
        lexical.append(timing.parse(r.headers["server-timing"]).get("lexical", 0.0))
    return {
        "lexical_p50_ms": float(np.percentile(lexical, 50)),
        "lexical_p99_ms": float(np.percentile(lexical, 99)),
    }


async def append_chunks(growth: Growth, chunks: int) -> dict[str, float]:
    """Grow by `chunks` with one client; the latency of its calls."""
    calls, start = len(growth.call_ms), growth.chunks
    await growth.to(start + chunks)
    took = growth.call_ms[calls:]
    return {
        "chunks_appended": growth.chunks - start,
        "appends": len(took),
        "append_p50_ms": float(np.percentile(took, 50)),
        "append_p99_ms": float(np.percentile(took, 99)),
        "append_max_ms": max(took),
    }


async def measure(args: argparse.Namespace, base_url: str, key: str, pg_url: str) -> dict[str, Any]:
    lines = (args.data / "s150.questions.jsonl").read_text().splitlines()
    questions = [json.loads(line)["question"] for line in lines]
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("VACUUM chunks")  # an empty pending list to start from
        org_chunks = await conn.fetchval("SELECT count(*) FROM chunks")
    finally:
        await conn.close()
    headers = {"Authorization": f"Bearer {key}"}
    result: dict[str, Any] = {"org_chunks": org_chunks, "passes": [], "rounds": []}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=600) as http:
        for label in ("cold", "settled"):
            result["passes"].append({"after": label, **await search_pass(http, questions)})
            progress(f"  search, {label}: {result['passes'][-1]}")
        growth = Growth(http, args.data, clients=1)
        for round_no in range(1, args.rounds + 1):
            result["rounds"].append(await append_chunks(growth, args.chunks))
            progress(f"  round {round_no}: {result['rounds'][-1]}")
            passed = await search_pass(http, questions)
            result["passes"].append({"after": f"round {round_no}", **passed})
            progress(f"  search after round {round_no}: {passed}")
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (appends, searches) = plt.subplots(1, 2, figsize=(11, 4))
    rounds = [f"round {i + 1}" for i in range(len(result["rounds"]))]
    for n, stat in enumerate(("append_p50_ms", "append_p99_ms", "append_max_ms")):
        x = np.arange(len(rounds)) + (n - 1) * 0.25
        appends.bar(x, [r[stat] for r in result["rounds"]], 0.25, label=stat.split("_")[1])
    appends.set_xticks(range(len(rounds)), rounds)
    appends.set_ylabel("ms")
    appends.set_title(f"50-message appends, {result['rounds'][0]['chunks_appended']:,} chunks")
    appends.legend()
    passes = [p["after"] for p in result["passes"]]
    for n, stat in enumerate(("lexical_p50_ms", "lexical_p99_ms")):
        x = np.arange(len(passes)) + (n - 0.5) * 0.35
        searches.bar(x, [p[stat] for p in result["passes"]], 0.35, label=stat.split("_")[1])
    searches.set_xticks(range(len(passes)), passes)
    searches.set_title("full-text ranking of a REST search")
    searches.legend()
    fig.suptitle(f"an org of {result['org_chunks']:,} chunks, growing; {result['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("Usage:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--chunks", type=int, default=3000, help="chunks appended each round")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        choices=range(1, 11),
        metavar="1-10",
        help="rounds of appends, the questions asked after each (default: 2)",
    )
    parser.add_argument(
        "--embedder",
        choices=["hashing", "transformer"],
        default="hashing",
        help="the one the org was grown with",
    )
    parser.add_argument("--data", type=Path, default=DATA, help="LongMemEval folder")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=ROOT / "var" / "bench-e2e",
        help="the data folder of the grown org (run.py's)",
    )
    parser.add_argument("--port", type=int, default=8290, help="port for the started stack")
    parser.add_argument("--machine", default="x86_64 CPU", help="the machine, for the results")
    parser.add_argument("--out", default="appends-on-a-grown-org", help="results file name")
    args = parser.parse_args()
    if not (args.data_dir / "postgres").is_dir():
        parser.error(f"no grown org in {args.data_dir}: run benchmarks/e2e/run.py first")
    progress(f"starting the stack on {args.data_dir}; logs in {args.data_dir / 'stack.log'}")
    with stack_in_subprocess(args.data_dir, args.port, args.embedder) as (base_url, key):
        pg_url, server = start_embedded(args.data_dir / "postgres")
        try:
            result = asyncio.run(measure(args, base_url, key, pg_url))
        finally:
            server.cleanup()
    result["machine"] = args.machine
    out = HERE / "results" / f"{args.out}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    progress(f"wrote {out} and .png")


if __name__ == "__main__":
    main()
