"""Peak memory of a fresh normserve worker per transport: one big request, or N concurrent ones against the budget.

    .venv/bin/python scripts/peak_memory.py                       # one ~61 MiB request per transport
    .venv/bin/python scripts/peak_memory.py --concurrency 8       # 8 at once, NORMSERVE_MAX_INFLIGHT_BYTES default
    .venv/bin/python scripts/peak_memory.py --concurrency 32 --env NORMSERVE_MAX_IN_FLIGHT=2

Each run starts its own server (one uvicorn process on 127.0.0.1, gRPC on a free port), warms it with a
small request, then reads VmRSS (at rest) and VmHWM (peak RSS) from /proc/PID/status around the load.
Prints one line per transport: body size, peak - rest, that over the bodies sent at once, and the statuses.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path

import grpc
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import grpc_load, servers, serving
from benchmarks.inprocess import sample
from benchmarks.load import Request, check

TRANSPORTS = ("V2 binary", "/normalize JSON", serving.GRPC)
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


async def _http(port: int, request: Request, n: int) -> list[str]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:

        async def one() -> str:
            try:
                r = await client.post(request.path, content=request.body, headers=request.headers)
                return str(r.status_code)
            except httpx.HTTPError as e:
                return type(e).__name__

        return list(await asyncio.gather(*(one() for _ in range(n))))


async def _grpc(port: int, body: bytes, n: int) -> list[str]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=grpc_load.OPTIONS) as channel:
        call = channel.unary_unary(MODEL_INFER)

        async def one() -> str:
            try:
                await call(body, timeout=120)
                return "OK"
            except grpc.aio.AioRpcError as e:
                return str(e.code().name)

        return list(await asyncio.gather(*(one() for _ in range(n))))


def measure(transport: str, payload: int, n: int, env: dict[str, str]) -> str:
    grpc_port = servers.free_port()
    with servers.serve("normserve", env, grpc_port=grpc_port) as srv:
        if transport == serving.GRPC:
            body = grpc_load.infer_request(sample((payload // 4096, 1024), seed=1))
            grpc_load.check(grpc_port, grpc_load.infer_request(sample((2, 8))))
            size = len(body)
        else:
            request = serving._sized_request(transport, payload)
            check(srv.port, serving.make_request(transport, sample((2, 8))))
            size = len(request.body)
        rest = servers.memory_kib(srv.pid)["VmRSS"] * 1024
        if transport == serving.GRPC:
            statuses = asyncio.run(_grpc(grpc_port, body, n))
        else:
            statuses = asyncio.run(_http(srv.port, request, n))
        peak = servers.memory_kib(srv.pid)["VmHWM"] * 1024
    added = peak - rest
    counts = ", ".join(f"{k} x{v}" for k, v in sorted(Counter(statuses).items()))
    return (
        f"{transport:16} {n:3} x {size / 2**20:5.1f} MiB: rest {rest / 2**20:6.0f} MiB, peak +{added / 2**20:6.0f} MiB"
        f" = {added / size:4.1f}x one body; {counts}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=int, default=64_000_000, help="body size (default 64,000,000 = 61 MiB)")
    p.add_argument("--concurrency", type=int, default=1, help="requests sent at once")
    p.add_argument("--transport", choices=TRANSPORTS, action="append", help="default: all three")
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server, repeatable")
    args = p.parse_args()
    env = {"NORMSERVE_MAX_BODY_BYTES": str(max(args.bytes + 65536, 1 << 26))}
    env.update(dict(e.split("=", 1) for e in args.env))
    for transport in args.transport or TRANSPORTS:
        print(measure(transport, args.bytes, args.concurrency, env), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
