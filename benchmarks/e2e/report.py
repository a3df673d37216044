"""The e2e benchmark's result files: JSON, CSV and a PNG of latency, recall and ingest."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np


def write(rows: list[dict[str, Any]], out: Path, label: str, meta: dict[str, Any]) -> None:
    """JSON, CSV and PNG of the rows. A row's `samples_*` lists (each latency, in the order
    taken) go to the JSON's `samples`, beside the row's system and size, not to the CSV."""
    out.mkdir(parents=True, exist_ok=True)
    samples = [
        {"system": r["system"], "chunks": r["chunks"]}
        | {k.removeprefix("samples_"): v for k, v in r.items() if k.startswith("samples_")}
        for r in rows
        if any(k.startswith("samples_") for k in r)
    ]
    rows = [{k: v for k, v in r.items() if not k.startswith("samples_")} for r in rows]
    results = {
        **meta,
        "rows": rows,
        "ratios": equal_recall_ratios(rows),
        "ingest_ratios": ingest_ratios(rows),
        "samples": samples,
    }
    (out / f"{label}.json").write_text(json.dumps(results, indent=2) + "\n")
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


def equal_recall_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each alternative setting timed beside the shard: the nprobe timed beside it if it
    finds at least as much (recall@10 from the service's row of that size), and its p50 as a
    share of the setting's. `nprobe` None: it does not find as much. (Runs up to 8cc4959 timed
    several nprobes beside each setting; of those the fastest that finds as much is taken.
    Runs from before the shard was timed beside the alternatives give none.)"""
    recalls = {
        r["chunks"]: {n: recall for n, _, recall in shard_curve(r)}
        for r in rows
        if r["system"] == "memory-service" and "shard_search_p50_ms" in r
    }
    out = []
    for r in rows:
        beside = {
            int(key.removeprefix("beside_nprobe").removesuffix("_p50_ms")): ms
            for key, ms in r.items()
            if key.startswith("beside_nprobe") and key.endswith("_p50_ms")
        }
        if r["system"] == "memory-service" or not beside or r["chunks"] not in recalls:
            continue
        found = recalls[r["chunks"]]
        enough = [n for n in beside if found[n] >= r["recall_at_10"]]
        best = min(enough, key=lambda n: beside[n], default=None)
        out.append(
            {
                "system": r["system"],
                "chunks": r["chunks"],
                "service_chunks": r["service_chunks"],
                "recall_at_10": r["recall_at_10"],
                "search_p50_ms": r["search_p50_ms"],
                "nprobe": best,
                "shard_recall_at_10": None if best is None else found[best],
                "shard_p50_ms": None if best is None else beside[best],
                "shard_share": None if best is None else beside[best] / r["search_p50_ms"],
            }
        )
    return out


def ingest_rate(row: dict[str, Any]) -> float:
    """The service's chunks a second until the work its growth left was done (the outbox
    drained, term statistics counted, rebuilds finished), as an alternative's load is timed
    until its last row is indexed. Rows of runs before `ingest_chunks_per_s` was written get
    it from the growth's own time and its settle time."""
    if "ingest_chunks_per_s" in row:
        return float(row["ingest_chunks_per_s"])
    seconds = row["growth_seconds"]
    settle = row.get("growth_settle_seconds", 0.0)
    return float(row["growth_chunks_per_s"] * seconds / (seconds + settle))


def ingest_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The service's ingest rate as a share of each alternative's load, at each size. One
    load serves every ef_search setting of an alternative. The service's rate past the first
    size is that of its growth from the size before; the alternatives load from empty."""
    service = {r["chunks"]: ingest_rate(r) for r in rows if r["system"] == "memory-service"}
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        if r["system"] == "memory-service" or _hybrid(r) or "ingest_per_second" not in r:
            continue
        system = r["system"].split("-ef")[0]
        grown = service.get(r["chunks"])  # the org's chunks, which the alternative loaded
        if grown is None or (system, r["service_chunks"]) in out:
            continue
        out[system, r["service_chunks"]] = {
            "system": system,
            "service_chunks": r["service_chunks"],
            "service_chunks_per_s": grown,
            "alternative_chunks_per_s": r["ingest_per_second"],
            "service_share": grown / r["ingest_per_second"],
        }
    return list(out.values())


def _hybrid_label(row: dict[str, Any]) -> str:
    """A hybrid variant's name, its keyword matches and, where measured, the share of the
    questions each side answered (service / pgvector)."""
    label = f"{row['system'].split('-hybrid-')[1]}\nkeywords {row['keyword_share']:.0%}"
    if row.get("answered") is not None and row.get("rest_answered") is not None:
        label += f"\nanswered {row['rest_answered']:.0%} / {row['answered']:.0%}"
    return label


def _hybrid(row: dict[str, Any]) -> bool:
    """A hybrid statement timed beside the REST search (alternatives.HybridResult)."""
    return "-hybrid-" in row["system"]


def _family(system: str) -> str:
    base = system.split("-ef")[0]
    return NAMES.get(base, base)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Search latency by size; recall against latency at the largest size; ingest rates and
    CPU; vector search at equal recall; hybrid search, each timed beside the service."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    service = [r for r in rows if r["system"] == "memory-service"]
    others = [r for r in rows if r["system"] != "memory-service" and not _hybrid(r)]
    fig, (ax1, ax2, ax3, ax4, ax5, ax6) = plt.subplots(1, 6, figsize=(30, 4.5))
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

    rates = {"memory service": ingest_rate(top)}
    for r in at_largest:
        rates[_family(r["system"])] = r["ingest_per_second"]  # one load per system
    ax3.bar(list(rates), list(rates.values()))
    ax3.tick_params(axis="x", labelrotation=15)
    ax3.set(ylabel="chunks/s")
    ax3.set_title(f"ingest until settled, {top['chunks']:,} chunks")

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

    # The shard's time at equal recall, as a share of each alternative setting's, both timed
    # query by query in the same loop.
    ratios = [r for r in equal_recall_ratios(rows) if r["service_chunks"] == largest]
    reached = [r for r in ratios if r["shard_share"] is not None]
    labels = [f"{_family(r['system'])}\n{r['system'].rsplit('-', 1)[-1]}" for r in reached]
    ax5.set_title(f"equal recall, timed beside, {top['chunks']:,} chunks")
    if reached:
        ax5.bar(labels, [r["shard_share"] for r in reached])
        ax5.axhline(1.0, color="black", linewidth=0.8)
        ax5.set(ylabel="shard's time / the alternative's")
        ax5.tick_params(axis="x", labelsize=6, labelrotation=90)
    else:
        ax5.axis("off")
        ax5.text(0.5, 0.5, "no alternative at this size", ha="center", transform=ax5.transAxes)

    # Hybrid search: pgvector's one statement against the REST search, in turns.
    hybrid = [r for r in rows if _hybrid(r) and r["service_chunks"] == largest]
    ax6.set_title(f"hybrid search p50, timed beside, {top['chunks']:,} chunks")
    if hybrid:
        x = np.arange(len(hybrid))
        ax6.bar(x - 0.2, [r["rest_p50_ms"] for r in hybrid], 0.4, label="memory service (REST)")
        ax6.bar(x + 0.2, [r["search_p50_ms"] for r in hybrid], 0.4, label="pgvector + full text")
        ax6.set_xticks(x, [_hybrid_label(r) for r in hybrid], fontsize=6)
        ax6.set(ylabel="ms, embedding taken out", yscale="log")
        ax6.legend(fontsize=7)
    else:
        ax6.axis("off")
        ax6.text(0.5, 0.5, "no hybrid timed at this size", ha="center", transform=ax6.transAxes)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
