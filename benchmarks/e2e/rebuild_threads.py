"""What a background rebuild costs on one FAISS thread and on two, the machine idle and busy.

An org's IVF index is rebuilt in the background as it grows (at 4,097, 8,193, 32,769...
vectors). The org serves meanwhile, so the rebuild's length matters little; its CPU is taken
from the shard's requests and writes. Measured here, in this process, alternating in rounds:

- `build_ivf` at each --sizes, on 1 and 2 FAISS threads: wall time and CPU time;
- an org grown to --grow vectors through the Registry, 17 vectors a write (a growth call's
  windows), with its rebuilds on one thread (SOLO_REBUILD_VECTORS, the shard's default) and
  on every core (SOLO_REBUILD_VECTORS = 0): the shard's CPU for the whole growth;

each with the machine idle and with another process spinning on one core (as
PostgreSQL, the API and the embedder keep the cores of a 2-core machine busy while an org
grows); every other round runs each pair the other way round; the medians are reported and
every sample kept. Vectors: the e2e corpus (respelt copies) with the hashing embedder, as
flat_or_ivf.py builds them. Writes results/rebuild-threads-<machine>.json and .png.

Usage: python benchmarks/e2e/rebuild_threads.py --machine "2-core AMD EPYC" [--rounds 3]
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import faiss
import matplotlib
import numpy as np
from recall_at_size import (
    chunk_texts,
    embed,
    index_options,
    machine_slug,
    progress,
    save,
    script_parser,
)

from embed_service.hashing import HashingEmbedder
from index_service import registry as registry_module
from index_service.main import EmptySource
from index_service.native import single_threaded_faiss, single_threaded_numpy_blas
from index_service.registry import Registry
from index_service.settings import IndexSettings
from index_service.stores import build_ivf

matplotlib.use("Agg")
import matplotlib.pyplot as plt

WRITE = 17  # vectors a write: the windows of a 50-message growth call
SOLO = registry_module.SOLO_REBUILD_VECTORS  # the shard's default
FLAT_THRESHOLD = IndexSettings().flat_threshold  # the shard's default


def spin() -> None:
    while True:
        pass


@contextmanager
def busy(on: bool) -> Iterator[None]:
    """Another process spinning on one core for the block, when `on`."""
    spinner = mp.Process(target=spin, daemon=True) if on else None
    if spinner is not None:
        spinner.start()
    try:
        yield
    finally:
        if spinner is not None:
            spinner.terminate()
            spinner.join()


def build(vectors: np.ndarray, threads: int, target: float) -> tuple[float, float]:
    """Wall and CPU seconds of one build_ivf on `threads` FAISS threads."""
    faiss.omp_set_num_threads(threads)
    wall, cpu = time.perf_counter(), time.process_time()
    build_ivf(np.arange(len(vectors), dtype=np.int64), vectors, target)
    return time.perf_counter() - wall, time.process_time() - cpu


async def grow(vectors: np.ndarray, solo: int, target: float) -> float:
    """CPU seconds of growing an org to len(vectors) with rebuilds solo up to `solo`."""
    registry_module.SOLO_REBUILD_VECTORS = solo
    single_threaded_faiss()  # the event loop's thread, as in the shard
    work = ThreadPoolExecutor(2)
    requests = ThreadPoolExecutor(2, initializer=single_threaded_faiss)
    registry = Registry(
        EmptySource(vectors.shape[1]),
        work,
        requests,
        flat_threshold=FLAT_THRESHOLD,
        target_recall=target,
    )
    cpu = time.process_time()
    for start in range(0, len(vectors), WRITE):
        ids = [f"c{i}" for i in range(start, min(len(vectors), start + WRITE))]
        await registry.upsert("org", 0, ids, ["conv"] * len(ids), vectors[start : start + WRITE])
        await asyncio.sleep(0.0005)  # writes arrive spread out, as over the network
    await registry.settle()
    spent = time.process_time() - cpu
    await registry.close()
    work.shutdown()
    requests.shutdown()
    return spent


def plot(result: dict[str, Any], path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    labels, width = [], 0.2
    for i, size in enumerate(result["sizes"]):
        for j, (load, threads) in enumerate(
            [(load, t) for load in ("idle", "busy") for t in (1, 2)]
        ):
            row = result["builds"][f"{size}"][load][f"{threads}"]
            left.bar(
                i + (j - 1.5) * width,
                row["cpu_s"],
                width,
                color=f"C{j}",
                label=f"{load}, {threads} thread{'s' * (threads > 1)}" if i == 0 else None,
            )
            left.plot(i + (j - 1.5) * width, row["wall_s"], "k_", markersize=12)
        labels.append(f"{size:,}")
    left.set_xticks(range(len(labels)), labels)
    left.set_xlabel("vectors built (black: wall time)")
    left.set_ylabel("CPU seconds, median of rounds")
    left.set_title("one build_ivf")
    left.legend(fontsize=8)
    grows = result["growth_cpu_s"]
    names = [
        f"{load}\n{mode}" for load in ("idle", "busy") for mode in ("every core", "one thread")
    ]
    values = [
        grows[load][mode] for load in ("idle", "busy") for mode in ("every core", "one thread")
    ]
    right.bar(names, values, color=["C0", "C1", "C0", "C1"])
    right.set_ylabel("the shard's CPU seconds, median of rounds")
    right.set_title(f"growing an org to {result['grow']:,} vectors, rebuilds on")
    fig.suptitle(f"background rebuilds by FAISS threads, {result['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[4097, 8193, 32769], help="sizes built alone"
    )
    parser.add_argument("--grow", type=int, default=10_745, help="vectors the org grows to")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are kept")
    index_options(parser)
    args = parser.parse_args()
    single_threaded_numpy_blas()
    texts = chunk_texts(max(max(args.sizes), args.grow), args.data, True)
    progress(f"embedding {len(texts):,} chunks (respelt copies) with the hashing embedder")
    vectors = embed(texts, HashingEmbedder())
    samples: dict[tuple[str, str, str], list[Any]] = {}
    for r in range(args.rounds):
        flip = r % 2 == 1  # every other round runs each pair the other way round

        def order(pair: tuple[Any, Any], flip: bool = flip) -> tuple[Any, Any]:
            return (pair[1], pair[0]) if flip else pair

        for load in order(("idle", "busy")):
            with busy(load == "busy"):
                for size in args.sizes:
                    for threads in order((1, 2)):
                        wall, cpu = build(
                            np.ascontiguousarray(vectors[:size]), threads, args.target_recall
                        )
                        key = (f"{size}", load, f"{threads}")
                        samples.setdefault(key, []).append((wall, cpu))
                for mode, solo in order((("every core", 0), ("one thread", SOLO))):
                    spent = asyncio.run(grow(vectors[: args.grow], solo, args.target_recall))
                    samples.setdefault(("grow", load, mode), []).append(spent)
                    progress(
                        f"round {r + 1}/{args.rounds}, {load}: growth, rebuilds on {mode}, "
                        f"{spent:.2f} s of CPU"
                    )
    builds: dict[str, Any] = {}
    for (size, load, threads), rows in samples.items():
        if size != "grow":
            builds.setdefault(size, {}).setdefault(load, {})[threads] = {
                "wall_s": statistics.median(w for w, _ in rows),
                "cpu_s": statistics.median(c for _, c in rows),
            }
    growth = {
        load: {
            mode: statistics.median(samples[("grow", load, mode)])
            for mode in ("every core", "one thread")
        }
        for load in ("idle", "busy")
    }
    result = {
        "machine": args.machine,
        "rounds": args.rounds,
        "sizes": args.sizes,
        "grow": args.grow,
        "builds": builds,
        "growth_cpu_s": growth,
        "samples": {" / ".join(key): rows for key, rows in samples.items()},
    }
    for size in args.sizes:
        for load in ("idle", "busy"):
            one, two = builds[f"{size}"][load]["1"], builds[f"{size}"][load]["2"]
            progress(
                f"{size:,} vectors, {load}: one thread {one['wall_s']:.2f} s "
                f"({one['cpu_s']:.2f} CPU), two {two['wall_s']:.2f} s ({two['cpu_s']:.2f} CPU)"
            )
    progress(f"growth CPU: {growth}")
    save(result, args.out / f"rebuild-threads-{machine_slug(args.machine)}", plot)


if __name__ == "__main__":
    main()
