"""What a round trip between two processes costs beyond the work it waits for, by how long
that work keeps the waiting side idle.

A second process answers each message on a pipe after spinning for --work-ms; the first
times the round trip and subtracts the work. On a virtual machine a CPU that idles past a
short spin halts, and waking it costs more than waking one that just went idle: a shard
`Search` wakes several threads (gRPC's poller, the event loop, a request thread, the
client's), each after idling for the scan's time. An embedded store pays none of it.

The same round trips are then timed with one spinning process a core at the lowest priority
(nice 19), so that no CPU idles: what the wake-ups cost shows as the difference.

Writes results/wakeup-<machine>.json and .png.

Usage:
  python benchmarks/index/wakeup.py --machine "2-core AMD EPYC"
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WARMUP = 20


def answer(conn: Connection) -> None:
    """Spin for the seconds each message asks, then reply; None stops."""
    while (seconds := conn.recv()) is not None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        conn.send(True)


def spin() -> None:
    """Keep a core busy at the lowest priority, until killed."""
    os.nice(19)
    while True:
        pass


def overheads(work_ms: list[float], calls: int) -> dict[str, float]:
    """p50 round trip less the work, in ms, for each amount of work."""
    mine, theirs = mp.Pipe()
    server = mp.Process(target=answer, args=(theirs,))
    server.start()
    out = {}
    try:
        for ms in work_ms:
            samples = []
            for i in range(WARMUP + calls):
                t0 = time.perf_counter()
                mine.send(ms / 1000)
                mine.recv()
                if i >= WARMUP:
                    samples.append(time.perf_counter() - t0)
            out[str(ms)] = float(np.percentile(samples, 50) * 1000 - ms)
            print(f"work {ms} ms: round trip {out[str(ms)]:.3f} ms beyond it", flush=True)
    finally:
        mine.send(None)
        server.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("Usage:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--work-ms",
        type=float,
        nargs="+",
        default=[0, 0.2, 0.5, 1, 3, 10],
        help="how long the answering process spins before each answer, each timed",
    )
    parser.add_argument("--calls", type=int, default=400, help="timed round trips each")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    parser.add_argument("--machine", default="x86_64 CPU", help="names the machine in files")
    args = parser.parse_args()
    idle = overheads(args.work_ms, args.calls)
    print("again, with a spinning process a core at nice 19", flush=True)
    spinners = [mp.Process(target=spin, daemon=True) for _ in range(os.cpu_count() or 1)]
    for spinner in spinners:
        spinner.start()
    try:
        busy = overheads(args.work_ms, args.calls)
    finally:
        for spinner in spinners:
            spinner.kill()
    result = {"machine": args.machine, "overhead_p50_ms": idle, "overhead_busy_p50_ms": busy}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("wakeup-" + re.sub(r"[^a-z0-9]+", "-", args.machine.lower()).strip("-"))
    path.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for points, label in ((idle, "idle CPUs"), (busy, "no CPU idle")):
        ax.plot([float(w) for w in points], list(points.values()), "o-", label=label)
    ax.legend()
    ax.set(xlabel="work the round trip waits for, ms", ylabel="round trip beyond it, ms p50")
    ax.set_xscale("symlog", linthresh=0.2)
    ax.set_title(f"a pipe round trip between two processes, {args.machine}", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=110)
    print(f"wrote {path}.json and .png")


if __name__ == "__main__":
    main()
