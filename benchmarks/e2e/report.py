"""The e2e benchmark's result files: JSON, CSV and a PNG of latency, recall and ingest."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any


def write(rows: list[dict[str, Any]], out: Path, label: str, meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{label}.json").write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    fields = sorted({k for r in rows for k in r})
    with open(out / f"{label}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    title = f"memory service vs alternatives, {meta['machine']}"
    if not meta.get("complete", True):
        title += f" (up to {max(r['chunks'] for r in rows):,} chunks so far)"
    plot(rows, out / f"{label}.png", title)


# How the alternatives are named in the plot; each runs at several ef_search values
# (`<system>-ef<n>`), of which the latency panel shows EF_SHOWN. Results of runs before Chroma
# had settings of its own name it `chroma` (ef_search 100).
NAMES = {
    "pgvector-hnsw": "pgvector",
    "pgvector-hnsw-fts": "pgvector + full text",
    "chroma": "Chroma",
}
EF_SHOWN = "-ef100"


def shard_curve(row: dict[str, Any]) -> list[tuple[int, float, float]]:
    """(nprobe, p50 ms, recall@10) of the shard's vector search at each nprobe timed."""
    points = {row["shard_nprobe"]: (row["shard_search_p50_ms"], row["shard_recall_at_10"])}
    for key in row:
        if key.startswith("shard_nprobe") and key.endswith("_p50_ms"):
            n = int(key.removeprefix("shard_nprobe").removesuffix("_p50_ms"))
            points[n] = (row[key], row[f"shard_nprobe{n}_recall_at_10"])
    return [(n, *points[n]) for n in sorted(points)]


def _family(system: str) -> str:
    base = system.split("-ef")[0]
    return NAMES.get(base, base)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Search latency by size; recall against latency at the largest size; ingest rates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    service = [r for r in rows if r["system"] == "memory-service"]
    others = [r for r in rows if r["system"] != "memory-service"]
    fig, (ax1, ax2, ax3, ax4) = plt.subplots(1, 4, figsize=(20, 4.5))
    sizes = [r["chunks"] for r in service]
    for key, label in (("rest_search", "REST hybrid"), ("mcp_search", "MCP vector")):
        ax1.plot(sizes, [r[f"{key}_p50_ms"] for r in service], "o-", label=f"{label} p50")
        ax1.plot(sizes, [r[f"{key}_p99_ms"] for r in service], "o--", label=f"{label} p99")
    if all("rest_search_own_p50_ms" in r for r in service):  # results of older runs lack it
        own = [r["rest_search_own_p50_ms"] for r in service]
        ax1.plot(sizes, own, "^-", label="REST, service's own p50")
    if all("shard_search_p50_ms" in r for r in service):
        shard = [r["shard_search_p50_ms"] for r in service]
        ax1.plot(sizes, shard, "v-", label="vector search alone (shard, gRPC) p50")
    for family in sorted({_family(r["system"]) for r in others}):
        alt = [r for r in others if _family(r["system"]) == family]
        shown = [r for r in alt if r["system"].endswith(EF_SHOWN)] or alt
        label = family + (f" ({EF_SHOWN[1:]})" if shown is not alt else "")
        ax1.plot(
            [r["chunks"] for r in shown], [r["search_p50_ms"] for r in shown], "s:", label=label
        )
    ax1.set(xscale="log", yscale="log", xlabel="chunks in the org", ylabel="search ms")
    ax1.set_title("search latency (p50 unless marked)")
    ax1.legend(fontsize=7)

    # The comparison panels are drawn at the largest size the alternatives ran at.
    largest = max((r["service_chunks"] for r in others), default=service[-1]["chunks"])
    at_largest = [r for r in others if r["service_chunks"] == largest]
    top = min(service, key=lambda r: abs(r["chunks"] - largest))
    ax2.scatter([top["mcp_search_p50_ms"]], [top["recall_at_10"]], label="memory service (MCP)")
    if "shard_search_p50_ms" in top:
        _, p50s, recalls = zip(*shard_curve(top), strict=True)  # one point per nprobe
        ax2.plot(p50s, recalls, "v-", label="memory service, shard alone")
    for family in sorted({_family(r["system"]) for r in at_largest}):
        points = sorted(
            (r["search_p50_ms"], r["recall_at_10"])
            for r in at_largest
            if _family(r["system"]) == family
        )
        ax2.plot(*zip(*points, strict=True), "s-", label=family)  # one point per ef_search
    ax2.set(xscale="log", xlabel="search p50 ms", ylabel="recall@10")
    ax2.set_title(f"recall against latency, {top['chunks']:,} chunks")
    ax2.legend(fontsize=7)

    rates = {"memory service": top["growth_chunks_per_s"]}
    for r in at_largest:
        rates[_family(r["system"])] = r["ingest_per_second"]  # one load per system
    ax3.bar(list(rates), list(rates.values()))
    ax3.tick_params(axis="x", labelrotation=15)
    ax3.set(ylabel="chunks/s")
    ax3.set_title(f"ingest, {top['chunks']:,} chunks")

    # What a chunk of ingest cost in CPU: the service by part, the alternatives' loads whole.
    prefix = "growth_cpu_ms_per_chunk_"
    parts = [k.removeprefix(prefix) for k in top if k.startswith(prefix)]
    bottom = 0.0
    for part in parts:  # results of older runs have none
        if part != "total":
            ax4.bar(["memory service"], [top[prefix + part]], bottom=[bottom], label=part)
            bottom += top[prefix + part]
    loads = {_family(r["system"]): r.get("ingest_cpu_ms_per_chunk") for r in at_largest}
    for system, ms in loads.items():
        if ms is not None:
            ax4.bar([system], [ms], color="grey")  # pgvector: PostgreSQL and its client
    ax4.set(ylabel="CPU ms a chunk")
    ax4.tick_params(axis="x", labelrotation=15)
    ax4.set_title(f"ingest CPU, {top['chunks']:,} chunks")
    ax4.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
