"""Embedding throughput: the raw model loop against the gRPC service, in one run.

Texts are chunks of 5 chat messages (window 5, stride 3, one `[role]: content` line per
message, as the service stores them) from LongMemEval. Its messages are long (5 whole ones are
mostly past the model's 384 tokens), so each message is cut to its first 30 words, and chunks
of 150-250 tokens (about 200) are kept.
The raw loop tokenizes, sorts by length and embeds batches with the service's own batch limits;
the service runs as a separate process (`python -m embed_service`) on loopback and is driven by
closed-loop clients at several concurrencies. Results go to results/ as JSON, CSV and PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import gzip
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from embed_service.backends import batch_limits, load_embedder
from embed_service.batcher import plan_batches
from embed_service.model import TransformerEmbedder
from embed_service.settings import EmbedSettings
from memory_proto import embed_pb2, embed_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO.parent / "shared/data/longmemeval/oracle.conversations.jsonl.gz"
RESULTS = Path(__file__).resolve().parent / "results"
H100_BF16_DENSE_PEAK = 989e12  # FLOP/s, H100 SXM datasheet, dense (no sparsity)


def log(message: str) -> None:
    """Progress on stderr, flushed at once."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _clip(content: str, words: int = 30) -> str:
    return " ".join(content.split()[:words])


def load_chunks(path: Path, limit: int) -> list[str]:
    """Chunk texts of 5 messages (stride 3) from the conversations file."""
    chunks: list[str] = []
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            messages = json.loads(line)["messages"]
            for start in range(0, max(len(messages) - 2, 1), 3):
                window = messages[start : start + 5]
                chunks.append("\n".join(f"[{m['role']}]: {_clip(m['content'])}" for m in window))
            if len(chunks) >= limit:
                break
    return chunks


def pick_texts(model: TransformerEmbedder, chunks: list[str], count: int) -> list[str]:
    """`count` texts of 150-250 tokens (about 200), repeating the pool when it is short."""
    lengths = [len(ids) for ids in model.tokenize(chunks)]
    pool = list(dict.fromkeys(c for c, n in zip(chunks, lengths, strict=True) if 150 <= n <= 250))
    log(f"{len(pool)} distinct chunks of 150-250 tokens")
    if not pool:
        raise SystemExit("no chunk of 150-250 tokens in the data")
    return [pool[i % len(pool)] for i in range(count)]


def flops_per_text(model: TransformerEmbedder, tokens: int) -> float:
    """Forward FLOPs of one text: 2 x weight-matrix parameters per token, plus attention."""
    config: Any = getattr(model.model, "config")  # noqa: B009 -- transformers' config is untyped
    linear = sum(
        p.numel()
        for name, p in model.model.named_parameters()
        if p.dim() == 2 and "embedding" not in name and "pooler" not in name
    )
    attention = 4 * config.num_hidden_layers * tokens * tokens * config.hidden_size
    return float(2 * linear * tokens + attention)


@dataclass
class Row:
    """One measured configuration."""

    mode: str  # "raw" or "service"
    concurrency: int
    texts_per_request: int
    texts: int
    seconds: float
    chunks_per_s: float
    tokens_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    mfu: float | None


def raw_loop(model: TransformerEmbedder, texts: list[str], settings: EmbedSettings) -> float:
    """Seconds to tokenize, sort and embed `texts` in the service's batch sizes, serially."""
    limits = batch_limits(settings, model.device)
    start = time.perf_counter()
    ids = sorted(model.tokenize(texts), key=len)
    for planned in plan_batches(
        [len(i) for i in ids], limits.batch_max_texts, limits.batch_token_budget
    ):
        model.embed([ids[i] for i in planned])
    return time.perf_counter() - start


def free_port() -> int:
    """A port that was free a moment ago on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def drive(
    port: int, texts: list[str], concurrency: int, per_request: int
) -> tuple[float, list[float]]:
    """Closed-loop clients send all `texts`; returns wall seconds and request latencies."""
    requests = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]
    latencies: list[float] = []
    options = [("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        stub = embed_pb2_grpc.EmbedServiceStub(channel)
        queue = iter(requests)

        async def client() -> None:
            for batch in queue:
                sent = time.perf_counter()
                response = await stub.Embed(embed_pb2.EmbedRequest(texts=batch), timeout=600)
                latencies.append(time.perf_counter() - sent)
                if len(response.vectors) != 4 * response.dim * len(batch):
                    raise RuntimeError("short response")

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return time.perf_counter() - start, latencies


async def wait_ready(port: int, timeout: float) -> dict[str, Any]:
    """Block until the service answers Health (it binds only once the model is loaded)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = embed_pb2_grpc.EmbedServiceStub(channel)
        health = await stub.Health(embed_pb2.HealthRequest(), wait_for_ready=True, timeout=timeout)
        return {"model": health.model, "device": health.device, "ready": health.ready}


def machine_name(device: str) -> str:
    """A short description of the machine the figures come from."""
    if device == "cuda":
        import torch

        gpu = torch.cuda.get_device_name(0)
        return f"{gpu}, {os.cpu_count()} CPU cores"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, CPU only"


def main() -> None:
    """Parse arguments, measure, write results."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="conversations .jsonl.gz")
    parser.add_argument("--texts", type=int, default=None, help="texts per measurement")
    parser.add_argument(
        "--texts-per-request", type=int, help="texts a call (default: 64 on a GPU, 8 on a CPU)"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        help="clients at once, each level timed (default: 1 4 16 64 on a GPU, 1 2 4 on a CPU)",
    )
    parser.add_argument("--label", default=None, help="machine label for the file names")
    parser.add_argument("--note", default="", help="free text stored with the results")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    args = parser.parse_args()

    settings = EmbedSettings()
    log(f"loading model (backend={settings.backend}, device={settings.device})")
    model = load_embedder(settings)
    if not isinstance(model, TransformerEmbedder):
        raise SystemExit("the benchmark measures the transformer backend")
    gpu = model.device == "cuda"
    count = args.texts or (40_000 if gpu else 64)
    per_request = args.texts_per_request or (64 if gpu else 8)
    levels = args.concurrency or ([1, 4, 16, 64] if gpu else [1, 2, 4])

    log(f"reading chunks from {args.data}")
    texts = pick_texts(model, load_chunks(args.data, 20_000), count)
    token_counts = [len(ids) for ids in model.tokenize(texts)]
    tokens = sum(token_counts)
    flops = sum(flops_per_text(model, n) for n in token_counts)
    log(f"{len(texts)} texts, {tokens / len(texts):.0f} tokens on average")

    def row(mode: str, conc: int, per: int, secs: float, lat: list[float]) -> Row:
        mfu = flops / secs / H100_BF16_DENSE_PEAK if gpu else None
        pct = (lambda q: float(np.percentile(lat, q) * 1000)) if lat else (lambda q: None)
        return Row(mode, conc, per, len(texts), secs, len(texts) / secs, tokens / secs,
                   pct(50), pct(99), mfu)  # fmt: skip

    rows: list[Row] = []
    log("raw model loop: warm-up")
    raw_loop(
        model,
        texts[: min(len(texts), 2 * batch_limits(settings, model.device).batch_max_texts)],
        settings,
    )
    seconds = raw_loop(model, texts, settings)
    rows.append(row("raw", 0, 0, seconds, []))
    log(f"raw loop: {len(texts) / seconds:.1f} chunks/s")
    if gpu:
        import torch

        torch.cuda.synchronize()

    port = free_port()
    env = {**os.environ, "EMBED_PORT": str(port), "EMBED_HOST": "127.0.0.1"}
    log(f"starting the service on 127.0.0.1:{port}")
    service = subprocess.Popen([sys.executable, "-m", "embed_service"], env=env, cwd=REPO)
    try:
        health = asyncio.run(wait_ready(port, timeout=600))
        log(f"service ready: {health}")
        asyncio.run(drive(port, texts[: per_request * 4], 4, per_request))  # warm-up
        for conc in levels:
            secs, lat = asyncio.run(drive(port, texts, conc, per_request))
            rows.append(row("service", conc, per_request, secs, lat))
            r = rows[-1]
            log(f"service c={conc}: {r.chunks_per_s:.1f} chunks/s, p50 {r.p50_ms:.0f} ms, "
                f"p99 {r.p99_ms:.0f} ms")  # fmt: skip
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=60)
    write_results(args, model, rows, tokens / len(texts))


def write_results(args: argparse.Namespace, model: TransformerEmbedder, rows: list[Row],
                  mean_tokens: float) -> None:  # fmt: skip
    """JSON with context, CSV of rows, PNG plot."""
    machine = machine_name(model.device)
    label = args.label or re.sub(r"[^a-z0-9]+", "-", machine.lower()).strip("-")[:40]
    args.out.mkdir(parents=True, exist_ok=True)
    raw = next(r for r in rows if r.mode == "raw")
    best = max((r for r in rows if r.mode == "service"), key=lambda r: r.chunks_per_s)
    summary = {
        "machine": machine,
        "device": model.device,
        "dtype": str(model.dtype).removeprefix("torch."),
        "mean_tokens_per_text": round(mean_tokens, 1),
        "raw_chunks_per_s": round(raw.chunks_per_s, 2),
        "best_service_chunks_per_s": round(best.chunks_per_s, 2),
        "service_over_raw": round(best.chunks_per_s / raw.chunks_per_s, 3),
        "mfu_peak_flops": H100_BF16_DENSE_PEAK if model.device == "cuda" else None,
        "note": args.note,
        "rows": [asdict(r) for r in rows],
    }
    base = args.out / f"embed_{label}"
    base.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    with base.with_suffix(".csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    plot(rows, machine, base.with_suffix(".png"))
    log(f"wrote {base}.json/.csv/.png")
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=2))


def plot(rows: list[Row], machine: str, path: Path) -> None:
    """Throughput and latency against client concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    service = [r for r in rows if r.mode == "service"]
    raw = next(r for r in rows if r.mode == "raw")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [r.concurrency for r in service]
    left.plot(xs, [r.chunks_per_s for r in service], "o-", label="service (gRPC)")
    left.axhline(raw.chunks_per_s, color="grey", linestyle="--", label="raw model loop")
    left.set(xscale="log", xlabel="concurrent clients", ylabel="chunks/s (~200 tokens)")
    left.set_xticks(xs, [str(x) for x in xs])
    left.set_ylim(bottom=0)
    left.legend()
    right.plot(xs, [r.p50_ms for r in service], "o-", label="p50")
    right.plot(xs, [r.p99_ms for r in service], "s-", label="p99")
    right.set(xscale="log", xlabel="concurrent clients", ylabel="request latency (ms)")
    right.set_xticks(xs, [str(x) for x in xs])
    right.legend()
    fig.suptitle(f"embed_service, all-mpnet-base-v2 — {machine}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
