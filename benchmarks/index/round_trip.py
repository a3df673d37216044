"""What an empty call between two Python processes costs, by transport and server kind.

The API calls the shard (and the embedder) over gRPC; on some machines that call is most of
a small org's `Search` (search_path.py). This asks, one call at a time from a blocking
client, a server that echoes 64 bytes:

- gRPC's asyncio server on uvloop, as the shard runs; the same with the reply made on a
  worker thread, as the shard hands each Search to a request thread; gRPC's thread-pool
  server;
- each over loopback TCP and over a Unix socket (`unix:` addresses);
- a bare Unix socket (send, receive), the floor under any protocol.

Each is timed in several rounds, alternated, and the median of the rounds' p50 is kept.
Writes results/round-trip-<machine>.json and .png.

Usage:
  python benchmarks/index/round_trip.py --machine "2-core Intel Xeon"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import re
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from bench_index import p50_ms

HERE = Path(__file__).resolve().parent
PAYLOAD = b"x" * 64
SERVERS = ("aio", "aio + worker thread", "thread pool")


def _handler(fn: Callable[..., Any]) -> Any:
    return grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(fn)}
    )


def serve_grpc(kind: str, address: str) -> None:
    if kind == "thread pool":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((_handler(lambda request, _: request),))
        server.add_insecure_port(address)
        server.start()
        server.wait_for_termination()
        return
    import uvloop

    pool = futures.ThreadPoolExecutor(max_workers=2)

    async def echo(request: bytes, _: Any) -> bytes:
        if kind == "aio":
            return request
        return await asyncio.get_running_loop().run_in_executor(pool, lambda: request)

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handler(echo),))
        server.add_insecure_port(address)
        await server.start()
        await server.wait_for_termination()

    uvloop.run(main())


def serve_socket(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    conn, _ = listener.accept()
    while data := conn.recv(4096):
        conn.sendall(data)


def grpc_call(address: str) -> Callable[[], Any]:
    stub: Any = grpc.insecure_channel(address).unary_unary("/bench.Echo/Echo")
    return lambda: stub(PAYLOAD, timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("Usage:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--machine", required=True, help="names the result files")
    parser.add_argument("--calls", type=int, default=1500, help="timed calls a round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each timing every server")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    args = parser.parse_args()

    folder = tempfile.mkdtemp(prefix="round-trip-")
    calls: dict[str, Callable[[], Any]] = {}
    servers = []
    for n, kind in enumerate(SERVERS):
        for transport, address in (
            ("tcp", f"127.0.0.1:{9560 + n}"),
            ("unix", f"unix:{folder}/grpc-{n}.sock"),
        ):
            servers.append(mp.Process(target=serve_grpc, args=(kind, address), daemon=True))
            calls[f"gRPC {kind}, {transport}"] = grpc_call(address)
    bare = f"{folder}/bare.sock"
    servers.append(mp.Process(target=serve_socket, args=(bare,), daemon=True))
    for server in servers:
        server.start()
    time.sleep(2)
    client = socket.socket(socket.AF_UNIX)
    client.connect(bare)

    def bare_call() -> None:
        client.sendall(PAYLOAD)
        client.recv(4096)

    calls["bare Unix socket"] = bare_call
    rounds: dict[str, list[float]] = {name: [] for name in calls}
    for number in range(1, args.rounds + 1):
        for name, call in calls.items():
            rounds[name].append(p50_ms(lambda _, call=call: call(), args.calls, warmup=200))
        print(
            f"round {number}/{args.rounds}: "
            + ", ".join(f"{n} {v[-1]:.3f}" for n, v in rounds.items())
        )
    result = {
        "machine": args.machine,
        "p50_ms": {name: statistics.median(values) for name, values in rounds.items()},
        "rounds_p50_ms": rounds,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"round-trip-{re.sub(r'[^a-z0-9]+', '-', args.machine.lower()).strip('-')}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, stem.with_suffix(".png"))
    print(f"wrote {stem}.json and .png: {result['p50_ms']}")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["p50_ms"])
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.barh(names, [result["p50_ms"][n] for n in names])
    for y, name in enumerate(names):
        ax.plot(result["rounds_p50_ms"][name], [y] * len(result["rounds_p50_ms"][name]), "k.")
    ax.invert_yaxis()
    ax.set(xlabel="round trip of an empty call, ms (bar: median of rounds; dots: rounds)")
    ax.set_title(f"one call at a time, {result['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
