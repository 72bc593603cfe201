"""Closed-loop HTTP load on 127.0.0.1: N keep-alive connections, each sending the next request on the answer.

The hot loop speaks HTTP/1.1 over asyncio streams instead of httpx: on this 2-core machine
httpx's AsyncClient tops out near 750 req/s on a trivial route (measured, same run as a raw
asyncio client doing 9,000), which would measure the client, not the server. httpx still
does the one-off correctness check of every cell (`check`) before the load starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx
import numpy as np

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Request:
    """One POST, prepared once and replayed."""

    path: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    def wire(self) -> bytes:
        lines = [f"POST {self.path} HTTP/1.1", f"Host: {LOOPBACK}", f"Content-Length: {len(self.body)}"]
        lines += [f"{k}: {v}" for k, v in self.headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body


@dataclass(frozen=True)
class LoadResult:
    requests: int
    errors: int
    seconds: float
    latencies_s: np.ndarray  # of the successful requests

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1e3) if self.latencies_s.size else float("nan")


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    if "content-length" in headers:
        return status, await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunks.append(await reader.readexactly(size + 2))
            if size == 0:
                return status, b"".join(c[:-2] for c in chunks)
    raise ValueError("response without Content-Length or chunked encoding")


async def _worker(
    port: int, wire: bytes, deadline: float, max_requests: int, latencies: list[float], errors: list[int]
) -> None:
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    try:
        while time.perf_counter() < deadline and len(latencies) + errors[0] < max_requests:
            start = time.perf_counter()
            writer.write(wire)
            try:
                status, _ = await asyncio.wait_for(_read_response(reader), timeout=max(1.0, deadline - start + 30))
            except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
                errors[0] += 1
                writer.close()
                reader, writer = await asyncio.open_connection(LOOPBACK, port)  # a fresh connection after a failure
                continue
            if status == 200:
                latencies.append(time.perf_counter() - start)
            else:
                errors[0] += 1
    finally:
        writer.close()


async def run_load(port: int, request: Request, concurrency: int, seconds: float, max_requests: int) -> LoadResult:
    """Closed loop for `seconds` (and at most max_requests); requests still in flight then are waited for."""
    wire = request.wire()
    latencies: list[float] = []
    errors = [0]
    start = time.perf_counter()
    deadline = start + seconds
    await asyncio.gather(*(_worker(port, wire, deadline, max_requests, latencies, errors) for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    return LoadResult(len(latencies), errors[0], elapsed, np.asarray(latencies))


def load(port: int, request: Request, concurrency: int, seconds: float, max_requests: int = 1_000_000) -> LoadResult:
    """run_load on a fresh event loop (uvloop when installed, as the servers use)."""
    try:
        import uvloop

        return uvloop.run(run_load(port, request, concurrency, seconds, max_requests))
    except ImportError:
        return asyncio.run(run_load(port, request, concurrency, seconds, max_requests))


def check(port: int, request: Request, verify: Callable[[httpx.Response], None] | None = None) -> httpx.Response:
    """One request through httpx: the cell's payload must answer 200 (and pass verify) before it is timed."""
    # identity, as the load loop asks: httpx would accept gzip, and the V2 routes would compress (slow and large).
    headers = {"Accept-Encoding": "identity", **request.headers}
    response = httpx.post(f"http://{LOOPBACK}:{port}{request.path}", content=request.body, headers=headers, timeout=120)
    if response.status_code != 200:
        raise RuntimeError(f"{request.path} answered {response.status_code}: {response.text[:300]}")
    if verify is not None:
        verify(response)
    return response
