"""How long an org waits while its IVF rebuild takes a snapshot, by org size.

A rebuild copies the org's vectors under its lock (`OrgIndex.begin_rebuild`); searches and
writes to that org wait meanwhile. The copy goes into room made beforehand without the lock
(`OrgIndex.snapshot_room`), whose first writes to fresh pages are the slow part. For each
size this builds an org's IVF index as the service does (random unit vectors: the copy does
not depend on them), then times, several times, the room (unlocked) and the copy (locked).

Usage: python benchmarks/index/bench_snapshot.py [--sizes 131072 524288 1048576] [--repeat 3]
Writes results/snapshot-<machine>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import faiss
import numpy as np

from index_service.org_index import OrgIndex
from index_service.stores import nlist_for

DIM = 768
HERE = Path(__file__).resolve().parent


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def ivf_org(n: int, rng: np.random.Generator) -> OrgIndex:
    vectors = rng.standard_normal((n, DIM), dtype=np.float32)
    faiss.normalize_L2(vectors)
    ids = [f"c{i}" for i in range(n)]
    conversations = [f"v{i // 30}" for i in range(n)]
    return OrgIndex.from_rows(
        ids, conversations, vectors, flat_threshold=20_000, target_recall=0.95
    )


def time_snapshot(org: OrgIndex) -> tuple[float, float]:
    """Seconds to make the room (`snapshot_room`, unlocked) and to fill it (`begin_rebuild`,
    under the org's lock in the service)."""
    start = time.perf_counter()
    room = org.snapshot_room()
    made = time.perf_counter()
    snapshot = org.begin_rebuild(room)
    done = time.perf_counter()
    assert np.unique(snapshot.labels).size == org.size, "a vector was copied twice"
    org.finish_rebuild(None)  # no new store: the org keeps the one it has
    return made - start, done - made


def plot(rows: list[dict[str, float]], path: Path, machine: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = [r["vectors"] for r in rows]
    for key, label in (("room_max_s", "room, unlocked (slowest)"), ("copy_max_s", "copy, locked")):
        ax.plot(sizes, [r[key] for r in rows], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("vectors in the org")
    ax.set_ylabel("seconds")
    ax.set_title(f"IVF rebuild snapshot: what the org waits for, 768-d, {machine}", fontsize=10)
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[131_072, 524_288, 1_048_576],
        help="vectors in the org snapshotted",
    )
    parser.add_argument("--repeat", type=int, default=3, help="snapshots timed per size")
    parser.add_argument(
        "--machine",
        default=f"{platform.machine()}-{os.cpu_count()}-core",
        help="names it in the results",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    args = parser.parse_args()

    rng = np.random.default_rng(1)
    rows = []
    for n in args.sizes:
        progress(f"building an IVF org of {n:,} vectors ({nlist_for(n)} lists)")
        org = ivf_org(n, rng)
        times = [time_snapshot(org) for _ in range(args.repeat)]
        room, copy = [t[0] for t in times], [t[1] for t in times]
        rows.append(
            {
                "vectors": n,
                "room_max_s": max(room),
                "room_min_s": min(room),
                "copy_max_s": max(copy),
                "copy_min_s": min(copy),
            }
        )
        progress(f"{n:,}: room {min(room):.2f}-{max(room):.2f} s, copy {max(copy):.3f} s at most")
        del org
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"snapshot-{args.machine}"
    meta = {"machine": args.machine, "faiss": faiss.__version__, "repeat": args.repeat}
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    plot(rows, stem.with_suffix(".png"), args.machine)
    progress(f"wrote {stem}.json and .png")


if __name__ == "__main__":
    main()
