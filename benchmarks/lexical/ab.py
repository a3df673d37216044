"""Two definitions of `lexical_search` timed in alternation on one org, every answer compared.

The schema's own function (the migrations as they are) is B; A is `--against`, a SQL file
that creates `lexical_search` (an earlier migration, or a draft), installed beside it under
another name. The org is loaded as run.py loads it (s150 windows up to --chunks, term
statistics counted); each s150 question is then asked of both, one after the other, in an
order that flips every round, with the service's plan settings (`lexical.search`'s
defaults), org-wide (--scoped 0) and narrowed to K conversations for each K of --scoped.
Alternating question by question keeps a drifting machine from favouring either side.

Reports each side's p50 and p90 and how many questions both answered with the same ids in
the same order. Writes results/lexical-ab-LABEL.json and .png.

Usage:
  python benchmarks/lexical/ab.py --against api_service/store/migrations/0016_*.sql
       [--chunks 30000] [--scoped 0 5 30] [--rounds 4] [--label L] [--machine M]
Database: DATABASE_URL when set (the org is deleted afterwards), else an embedded PostgreSQL
in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Any

import asyncpg
from run import (
    K,
    add_output_arguments,
    database,
    load_org,
    percentiles,
    progress,
    questions_asked,
    save,
)

from api_service.core.ids import new_id
from api_service.store import lexical
from api_service.store.migrate import migrate_url

AGAINST = "lexical_search_against"  # A's name beside the schema's function
SIDES = {
    "A": "SELECT id FROM lexical_search_against($1, $2, $3, $4, $5, $6, $7) AS id",
    "B": "SELECT id FROM lexical_search($1, $2, $3, $4, $5, $6, $7) AS id",
}


async def run(args: argparse.Namespace, database_url: str) -> dict[str, Any]:
    await migrate_url(database_url)
    conn = await asyncpg.connect(database_url)
    definition = args.against.read_text()
    if "FUNCTION lexical_search(" not in definition:
        raise SystemExit(f"{args.against} does not create lexical_search")
    await conn.execute(definition.replace("FUNCTION lexical_search(", f"FUNCTION {AGAINST}("))
    org_id = new_id("org")
    try:
        size, conversations = await load_org(
            conn, org_id, "bench-lexical-ab", args.data, args.chunks
        )
        results = []
        for k in args.scoped:
            questions = questions_asked(args.data, args.questions, k, conversations)
            times: dict[str, list[float]] = {side: [] for side in SIDES}
            same = 0
            for round_no in range(args.rounds):
                order = list(SIDES) if round_no % 2 == 0 else list(reversed(SIDES))
                for text, scope in questions:
                    found = {}
                    for side in order:
                        started = time.perf_counter()
                        rows = await conn.fetch(
                            SIDES[side],
                            org_id,
                            text,
                            K,
                            scope,
                            lexical.MATCH_BUDGET,
                            lexical.EXACT_BELOW,
                            lexical.EXACT_CAP,
                        )
                        times[side].append(1000 * (time.perf_counter() - started))
                        found[side] = [r["id"] for r in rows]
                    same += found["A"] == found["B"]
                progress(f"  scope {k or 'org-wide'}: round {round_no + 1}/{args.rounds}")
            result: dict[str, Any] = {"scoped_to_conversations": k}
            for side in SIDES:
                p50, p90, _ = percentiles(times[side])
                result[f"{side}_p50_ms"], result[f"{side}_p90_ms"] = p50, p90
            result["same_answers"] = same
            result["asked"] = args.rounds * len(questions)
            progress(f"  {result}")
            results.append(result)
        server_version = await conn.fetchval("SHOW server_version")
    finally:
        await conn.execute("DELETE FROM orgs WHERE org_id = $1", org_id)
        await conn.close()
    return {
        "machine": args.machine,
        "postgres": server_version,
        "database": "DATABASE_URL" if os.environ.get("DATABASE_URL") else "embedded",
        "A": str(args.against),
        "B": "the schema's lexical_search",
        "chunks": size,
        "questions": len(questions),
        "rounds": args.rounds,
        "results": results,
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    names = [f"{r['scoped_to_conversations']} conversations" if r["scoped_to_conversations"]
             else "org-wide" for r in rows]  # fmt: skip
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.38
    sides = (("A", f"A: {Path(report['A']).name}"), ("B", "B: the schema's"))
    for offset, (side, label) in zip((-width / 2, width / 2), sides, strict=True):
        xs = [i + offset for i in range(len(rows))]
        ax.bar(xs, [r[f"{side}_p50_ms"] for r in rows], width, label=f"{label} p50")
        ax.scatter(xs, [r[f"{side}_p90_ms"] for r in rows], marker="_", s=200, color="black")
    for i, r in enumerate(rows):
        ax.annotate(f"same {r['same_answers']}/{r['asked']}", (i, 0), xytext=(0, 4),
                    textcoords="offset points", ha="center", fontsize=8)  # fmt: skip
    ax.set_xticks(range(len(rows)), names)
    ax.set_ylabel("ms a search (bars p50, marks p90)")
    ax.set_title(
        f"lexical_search A against B, in alternation, {report['chunks']:,} chunks\n"
        f"{report['machine']}\nPostgreSQL {report['postgres'].split()[0]} ({report['database']})",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("Usage:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--against",
        type=Path,
        required=True,
        help="SQL file creating lexical_search (A), timed against the schema's own (B)",
    )
    parser.add_argument("--chunks", type=int, default=30_000, help="chunks in the org")
    parser.add_argument("--questions", type=int, default=150, help="s150 questions to ask")
    parser.add_argument(
        "--scoped",
        type=int,
        nargs="+",
        default=[0, 5, 30],
        metavar="K",
        help="conversations each question is narrowed to, one pass each (0: org-wide)",
    )
    parser.add_argument("--rounds", type=int, default=4, help="passes over the questions")
    add_output_arguments(parser, "lexical-ab")
    args = parser.parse_args()
    with database() as (url, _):
        report = asyncio.run(run(args, url))
    save(report, args, "lexical-ab", plot)


if __name__ == "__main__":
    main()
