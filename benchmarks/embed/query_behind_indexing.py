"""How long a search's query waits for embed_service while it is busy indexing.

An append's windows reach embed_service in calls of up to 64 texts, four at a time (the
indexer's batch and concurrency); a search sends one text, under a 10 s deadline. On a CPU
such a round of calls takes tens of seconds. This starts `python -m embed_service` from the
checkout in the current directory (run it from a worktree of each commit to compare two),
times --rounds single-text queries with nothing else in flight, then in each of --rounds
rounds sends the indexing calls (LongMemEval windows), waits --delay seconds and times one
query. Writes results/query-behind-indexing-<label>.json and .png.

Usage:
  python benchmarks/embed/query_behind_indexing.py --machine "2-core AMD EPYC" --label zen5-NEW
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc
from bench_embed import DEFAULT_DATA, RESULTS, free_port, load_chunks, log, wait_ready

from memory_proto import embed_pb2, embed_pb2_grpc

QUERY = "what did I say about the trip to the mountains?"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", required=True, help="where the figures come from")
    parser.add_argument("--label", help="file name part (default: from --machine and commit)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of indexing (default 5)")
    parser.add_argument("--calls", type=int, default=4, help="indexing calls a round (4)")
    parser.add_argument("--texts-per-call", type=int, default=64, help="texts a call (64)")
    parser.add_argument(
        "--delay", type=float, default=0.5, help="seconds from the indexing to the query (0.5)"
    )
    parser.add_argument(
        "--backend", choices=["transformer", "hashing"], default="transformer", help="model"
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="conversations file")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    return parser.parse_args()


async def measure(port: int, args: argparse.Namespace, windows: list[str]) -> dict[str, object]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = embed_pb2_grpc.EmbedServiceStub(channel)

        async def query_ms() -> float:
            sent = time.perf_counter()
            await stub.Embed(embed_pb2.EmbedRequest(texts=[QUERY]), timeout=600)
            return 1000 * (time.perf_counter() - sent)

        await query_ms()  # warm-up
        idle = [await query_ms() for _ in range(args.rounds)]
        log(f"query with nothing in flight: p50 {statistics.median(idle):.0f} ms")
        behind, indexing = [], []
        size = args.texts_per_call
        for round_ in range(args.rounds):
            started = time.perf_counter()
            calls = [
                asyncio.ensure_future(
                    stub.Embed(
                        embed_pb2.EmbedRequest(texts=windows[i * size : (i + 1) * size]),
                        timeout=3600,
                    )
                )
                for i in range(args.calls)
            ]
            await asyncio.sleep(args.delay)
            behind.append(await query_ms())
            await asyncio.gather(*calls)
            indexing.append(time.perf_counter() - started)
            log(
                f"round {round_ + 1}/{args.rounds}: query {behind[-1]:.0f} ms behind "
                f"{args.calls * size} texts that took {indexing[-1]:.1f} s"
            )
    return {
        "idle_ms": idle,
        "behind_ms": behind,
        "indexing_s": indexing,
        "idle_p50_ms": statistics.median(idle),
        "behind_p50_ms": statistics.median(behind),
        "behind_max_ms": max(behind),
        "indexing_p50_s": statistics.median(indexing),
    }


def plot(result: dict[str, object], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    behind = result["behind_ms"]
    assert isinstance(behind, list)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(range(1, len(behind) + 1), behind, label="query behind indexing")
    ax.axhline(float(str(result["idle_p50_ms"])), color="grey", linestyle="--", label="idle p50")
    ax.set(xlabel="round", ylabel="query embedding (ms)", yscale="log", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    args = parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    texts_needed = args.calls * args.texts_per_call
    windows = load_chunks(args.data, texts_needed)
    windows = (windows * (texts_needed // max(len(windows), 1) + 1))[:texts_needed]
    port = free_port()
    env = {
        **os.environ,
        "EMBED_PORT": str(port),
        "EMBED_HOST": "127.0.0.1",
        "EMBED_BACKEND": args.backend,
    }
    log(f"starting embed_service ({args.backend}) from {Path.cwd()} at {commit}")
    service = subprocess.Popen([sys.executable, "-m", "embed_service"], env=env)
    try:
        health = asyncio.run(wait_ready(port, timeout=600))
        log(f"ready: {health}")
        result = asyncio.run(measure(port, args, windows))
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=60)
    label = args.label or re.sub(r"[^a-z0-9]+", "-", f"{args.machine} {commit}".lower())
    summary = {"machine": args.machine, "commit": commit, **health, **vars(args), **result}
    summary = {k: str(v) if isinstance(v, Path) else v for k, v in summary.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    base = args.out / f"query-behind-indexing-{label.strip('-')}"
    base.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(result, f"a query while indexing, {commit}\n{args.machine}", base.with_suffix(".png"))
    log(f"wrote {base}.json and .png")


if __name__ == "__main__":
    main()
