"""Tokenization: CPU a text of the embedding service's tokenizer on whole chunk windows.

Texts are the windows the service embeds: 5 whole LongMemEval messages (window 5, stride 3,
one `[role]: content` line per message), mostly past the model's 384 tokens. The service's
`tokenize` (a prefix of whole words first, the text's first 24,576 characters only when that
prefix is short of 384 tokens) is timed against tokenizing each text's first 24,576 characters
outright, in rounds that alternate the two, single-threaded, on CPU time; every text must get
the same ids both ways. Writes results/tokenize-<label>.json and .png.

Usage: python benchmarks/embed/bench_tokenize.py [--texts 6000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # CPU time of one thread, not of idle spinners

from api_service.core.chunking import STRIDE, WINDOW, chunk_text
from embed_service.backends import load_embedder
from embed_service.model import _CLIP_CHARS, MAX_TOKENS, TransformerEmbedder
from embed_service.settings import EmbedSettings

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO.parent / "shared/data/longmemeval/s150.conversations.jsonl.gz"
RESULTS = Path(__file__).resolve().parent / "results"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def windows(path: Path, count: int) -> list[str]:
    """The first `count` windows of the conversations, with their whole messages."""
    texts: list[str] = []
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            messages = [(m["role"], m["content"]) for m in json.loads(line)["messages"]]
            for start in range(0, len(messages), STRIDE):
                texts.append(chunk_text(messages[start : start + WINDOW]))
            if len(texts) >= count:
                return texts[:count]
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("Usage:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="conversations .jsonl.gz")
    parser.add_argument("--texts", type=int, default=6000, help="windows to tokenize")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each way")
    parser.add_argument(
        "--label",
        default=f"{os.cpu_count()}-core-{platform.machine()}-cpu",
        help="machine label for the file names",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    args = parser.parse_args()

    texts = windows(args.data, args.texts)
    log(f"{len(texts):,} windows, median {statistics.median(map(len, texts)):,.0f} characters")
    model = load_embedder(
        EmbedSettings(backend="transformer", device="cpu", model_cache_dir=REPO / "var" / "models")
    )
    assert isinstance(model, TransformerEmbedder)
    tokenizer = model._tokenizer  # the service's own, configured as it uses it

    def outright() -> list[list[int]]:
        return [e.ids for e in tokenizer.encode_batch([t[:_CLIP_CHARS] for t in texts])]

    def service() -> list[list[int]]:
        return [ids.tolist() for ids in model.tokenize(texts)]

    got = service()
    if got != outright():
        raise SystemExit("the service's tokenize gave other ids than tokenizing outright")
    past = sum(1 for ids in got if len(ids) == MAX_TOKENS)
    log(f"same ids both ways; {past:,} windows reach 384 tokens")

    timings: dict[str, list[float]] = {"outright": [], "service": []}
    for round_no in range(1, args.rounds + 1):
        ways = [("outright", outright), ("service", service)]
        for name, run in ways if round_no % 2 else ways[::-1]:  # each goes first in turn
            started = time.process_time()
            run()
            timings[name].append((time.process_time() - started) * 1e6 / len(texts))
        log(
            f"round {round_no}/{args.rounds}: outright {timings['outright'][-1]:,.0f} µs, "
            f"service {timings['service'][-1]:,.0f} µs of CPU a window"
        )

    result = {
        "label": args.label,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "windows": len(texts),
        "median_chars": statistics.median(map(len, texts)),
        "windows_at_384_tokens": past,
        "cpu_us_per_window": {name: min(values) for name, values in timings.items()},
        "rounds_cpu_us_per_window": timings,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"tokenize-{args.label}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, stem.with_suffix(".png"))
    log(f"wrote {stem}.json and .png")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = result["cpu_us_per_window"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(["first 24,576 chars", "whole-word prefix first"], [best["outright"], best["service"]])
    ax.set(ylabel="CPU µs a window (best round)")
    ax.set_title(f"tokenizing {result['windows']:,} windows, {result['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
