"""A/B of one-message appends, and of searches, between two commits, in alternated rounds on
one machine.

    python benchmarks/e2e/append_ab.py BEFORE AFTER [--rounds 6] [--appends 300]

A 2-core machine's speed drifts by 10-30% within minutes, more than most changes to the
append path move it, so two runs one after the other do not compare. Each round starts the
stack (embedded PostgreSQL, hashing embedder) from each commit in turn, on a fresh data
folder, and times --appends one-message appends into a new conversation after a warm-up, as
`run.py` times them: the whole request at the client, and the service's own time with its
parts from Server-Timing (write, vectors, index; embed_wait is left out of `own`). Then it
times as many REST (hybrid) searches of the org that conversation makes, org-wide and scoped
to it (`search_own` and `scoped_own`, the embedding taken out as `run.py` does; `search_client`
as the client sees an org-wide one). The order of the two alternates between rounds. Each
commit runs from a git worktree (under var/append-ab, removed at the end) with this
checkout's virtual environment.

Reports each part's median over rounds for both commits, and the median of the rounds'
paired differences (after - before): a round's two runs are minutes apart, so drift cancels
more in a pair than across the whole run. Writes results/append-ab-<before>-<after>.json
and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PARTS = ("own", "write", "vectors", "index", "client", "search_own", "scoped_own", "search_client")
WARMUP = 30


async def _appends_and_searches(base_url: str, key: str, count: int) -> dict[str, float]:
    from own_time import without_embedding  # this checkout's rule, whatever the commit

    from api_service import timing  # the commit's, found first on PYTHONPATH

    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as http:
        r = await http.post("/api/v1/conversations", json={"title": "append a/b"})
        r.raise_for_status()
        cid = r.json()["conversation_id"]
        samples: dict[str, list[float]] = {part: [] for part in PARTS}
        for i in range(WARMUP + count):
            message = {"role": "user", "content": f"note {i}: the meeting moved to Thursday"}
            t0 = time.perf_counter()
            r = await http.post(
                "/api/v1/messages", json={"conversation_id": cid, "messages": [message]}
            )
            took = time.perf_counter() - t0
            r.raise_for_status()
            if i < WARMUP:
                continue
            parts = timing.parse(r.headers["server-timing"])
            samples["own"].append(without_embedding(parts))
            samples["client"].append(took * 1000)
            for part in ("write", "vectors", "index"):
                samples[part].append(parts.get(part, 0.0))
        for i in range(WARMUP + count):
            question = {"q": f"when did note {i % 97} say the meeting moved"}
            for scope, part in (({}, "search_own"), ({"conversation_id": cid}, "scoped_own")):
                t0 = time.perf_counter()
                r = await http.get("/api/v1/search", params={**question, **scope})
                took = time.perf_counter() - t0
                r.raise_for_status()
                if i >= WARMUP:
                    samples[part].append(
                        without_embedding(timing.parse(r.headers["server-timing"]))
                    )
                    if not scope:
                        samples["search_client"].append(took * 1000)
    return {part: float(np.percentile(values, 50)) for part, values in samples.items()}


def one_run(args: argparse.Namespace) -> None:
    """Child mode: the stack from the current directory's commit; prints the p50s as JSON."""
    from api_service.devstack import stack_in_subprocess

    with stack_in_subprocess(args.data_dir, args.port, "hashing", fresh=True) as (base, key):
        print(json.dumps(asyncio.run(_appends_and_searches(base, key, args.appends))), flush=True)
    shutil.rmtree(args.data_dir, ignore_errors=True)


def _worktree(rev: str, where: Path) -> Path:
    path = where / rev
    if not path.exists():
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(path), rev],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    return path


def _measure(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("DATABASE_URL", None)
    command = [sys.executable, __file__, "--one", "--appends", str(args.appends)]
    command += ["--port", str(args.port), "--data-dir", str(args.work / "data")]
    done = subprocess.run(
        command, cwd=tree, env=env, check=True, capture_output=True, text=True, timeout=900
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def compare(args: argparse.Namespace) -> dict[str, Any]:
    args.work.mkdir(parents=True, exist_ok=True)
    trees = {rev: _worktree(rev, args.work) for rev in (args.before, args.after)}
    runs: dict[str, list[dict[str, float]]] = {args.before: [], args.after: []}
    try:
        for r in range(args.rounds):
            order = [args.before, args.after] if r % 2 == 0 else [args.after, args.before]
            for rev in order:
                runs[rev].append(_measure(trees[rev], args))
                got = runs[rev][-1]
                _progress(
                    f"round {r + 1}/{args.rounds}, {rev}: "
                    + ", ".join(f"{p} {got[p]:.2f}" for p in PARTS)
                )
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
        shutil.rmtree(args.work / "data", ignore_errors=True)
        with contextlib.suppress(OSError):
            args.work.rmdir()  # only if nothing else was left there
    result: dict[str, Any] = {
        "machine": args.machine,
        "before": args.before,
        "after": args.after,
        "rounds": args.rounds,
        "appends": args.appends,
        "runs": runs,
    }
    for part in PARTS:
        before = [run[part] for run in runs[args.before]]
        after = [run[part] for run in runs[args.after]]
        result[f"{part}_p50_ms_before"] = round(statistics.median(before), 3)
        result[f"{part}_p50_ms_after"] = round(statistics.median(after), 3)
        pairs = [a - b for a, b in zip(after, before, strict=True)]
        result[f"{part}_paired_change_ms"] = round(statistics.median(pairs), 3)
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(PARTS) // 2, figsize=(3 * len(PARTS) // 2, 6.4))
    axes = axes.ravel()
    rounds = np.arange(1, result["rounds"] + 1)
    for ax, part in zip(axes, PARTS, strict=True):
        for rev in (result["before"], result["after"]):
            ax.plot(rounds, [run[part] for run in result["runs"][rev]], "o-", label=rev)
        change = result[f"{part}_paired_change_ms"]
        ax.set_title(f"{part}: {change:+.2f} ms (paired median)", fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel("p50 ms")
        ax.legend(fontsize=7)
    fig.suptitle(
        f"one-message appends and searches, {result['appends']} each a run; {result['machine']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("before", nargs="?", help="commit to compare from")
    parser.add_argument("after", nargs="?", help="commit to compare with it")
    parser.add_argument("--rounds", type=int, default=6, help="rounds (each runs both commits)")
    parser.add_argument(
        "--appends", type=int, default=300, help="timed appends a run, and as many searches"
    )
    parser.add_argument("--port", type=int, default=8430, help="port of the started stacks")
    parser.add_argument("--machine", default="this machine", help="names it in the plot")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    parser.add_argument(
        "--work",
        type=Path,
        default=ROOT / "var" / "append-ab",
        help="folder for the worktrees and data, removed at the end",
    )
    parser.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_run(args)
        return
    if not (args.before and args.after):
        parser.error("give the two commits to compare: BEFORE AFTER")
    for side in ("before", "after"):  # short hashes: names of worktrees and result files
        rev = subprocess.run(
            ["git", "rev-parse", "--short", getattr(args, side)],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
        setattr(args, side, rev.stdout.strip())
    result = compare(args)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"append-ab-{args.before}-{args.after}"
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out / f"{name}.png")
    changes = ", ".join(f"{p} {result[f'{p}_paired_change_ms']:+.3f}" for p in PARTS)
    _progress(f"wrote {args.out / name}.json and .png; paired change (ms): {changes}")


if __name__ == "__main__":
    main()
