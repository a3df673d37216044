"""Run the load scenarios headless against a local stack and plot them.

Usage: python benchmarks/locust/run.py [--users 20] [--seconds 60] [--embedder hashing]

Starts `memctl up` on its own data folder (the hashing embedder by default, so the figures are
the service's own, not the model's), runs three scenarios one after another — agents over MCP,
platform teams over REST, and both together — and writes locust's CSV files and a PNG per
scenario under benchmarks/locust/results/.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from api_service.devstack import add_embedder_option, stack_in_subprocess

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCENARIOS = {
    "agents": ["AgentUser"],
    "platform": ["PlatformUser"],
    "mix": ["AgentUser", "PlatformUser"],
}


def plot(prefix: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(f"{prefix}_stats_history.csv") as history:
        rows: list[dict[str, Any]] = [
            r for r in csv.DictReader(history) if r["Name"] == "Aggregated"
        ]
    t0 = int(rows[0]["Timestamp"])
    t = [int(r["Timestamp"]) - t0 for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax1.plot(t, [float(r["Requests/s"]) for r in rows], label="requests/s")
    ax1.plot(t, [float(r["Failures/s"]) for r in rows], label="failures/s")
    ax1.set_ylabel("per second")
    ax1.legend()
    for pct in ("50%", "95%", "99%"):
        ax2.plot(t, [float(r[pct]) if r[pct] != "N/A" else 0 for r in rows], label=f"p{pct[:-1]}")
    ax2.set_ylabel("latency (ms)")
    ax2.set_xlabel("seconds")
    ax2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(f"{prefix}.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=20, help="simulated users per scenario")
    parser.add_argument(
        "--spawn-rate", type=float, default=5, help="users started a second (default: 5)"
    )
    parser.add_argument("--seconds", type=int, default=60, help="duration of each scenario")
    add_embedder_option(parser)
    parser.add_argument(
        "--port", type=int, default=8390, help="port of the started stack (and the next two)"
    )
    parser.add_argument(
        "--scenario", choices=[*SCENARIOS, "all"], default="all", help="which to run (default: all)"
    )
    parser.add_argument(
        "--out", type=Path, default=HERE / "results", help="folder for the CSV and PNG files"
    )
    args = parser.parse_args()
    data_dir = ROOT / "var" / "bench-locust"
    data_dir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    quiet = {"MEMORY_LOG_LEVEL": "WARNING"}
    with stack_in_subprocess(data_dir, args.port, args.embedder, quiet) as (base_url, key):
        env["MEMORY_API_KEY"] = key
        for name, users in SCENARIOS.items():
            if args.scenario not in ("all", name):
                continue
            prefix = args.out / name
            print(f"scenario {name}: {args.users} users for {args.seconds}s", flush=True)
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "locust",
                    "-f",
                    str(HERE / "locustfile.py"),
                    "--headless",
                    "--host",
                    base_url,
                    "-u",
                    str(args.users),
                    "-r",
                    str(args.spawn_rate),
                    "-t",
                    f"{args.seconds}s",
                    "--csv",
                    str(prefix),
                    "--only-summary",
                    *users,
                ],
                env=env,
                check=False,
            )
            plot(prefix, f"{name}: {args.users} users, {args.embedder} embedder")
            print(f"  wrote {prefix}_stats.csv and {prefix}.png", flush=True)


if __name__ == "__main__":
    main()
