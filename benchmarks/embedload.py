"""The embeddings section's load: closed-loop clients on raw sockets against one server, and a lone short text."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import numpy as np

from benchmarks.embedpeers import Running, request
from benchmarks.embedrows import SHORT_TEXT, EmbeddingsPlan
from benchmarks.load import LOOPBACK, _read_response
from benchmarks.pinned import tree_cpu_seconds


async def _client(port: int, wires: list[bytes], offset: int, deadline: float, latencies: list[float]) -> int:
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    errors, i = 0, offset
    try:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            writer.write(wires[i % len(wires)])
            status, _ = await _read_response(reader)
            if status == 200:
                latencies.append(time.perf_counter() - start)
            else:
                errors += 1
            i += 1
    finally:
        writer.close()
    return errors


async def _load(port: int, wires: list[bytes], concurrency: int, seconds: float) -> tuple[int, int, float, list[float]]:
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + seconds
    # each client starts at its own request, so the two do not send the same texts in step
    errs = await asyncio.gather(
        *(_client(port, wires, k * len(wires) // concurrency, deadline, latencies) for k in range(concurrency))
    )
    return len(latencies), sum(errs), time.perf_counter() - start, latencies


def cell(running: Running, groups: list[list[str]], plan: EmbeddingsPlan) -> dict[str, Any]:
    """The server under the closed loop: sentences/s, server CPU per sentence, p50/p99 of a request."""
    wires = [request(running, g).wire() for g in groups]
    if plan.warm_s > 0:
        asyncio.run(_load(running.server.port, wires, plan.concurrency, plan.warm_s))
    before = tree_cpu_seconds(running.server.pid)
    done, errors, seconds, lat = asyncio.run(_load(running.server.port, wires, plan.concurrency, plan.seconds))
    cpu = tree_cpu_seconds(running.server.pid) - before
    sentences = done * plan.batch
    return {
        "sentences_per_s": sentences / seconds,
        "cpu_ms_per_sentence": cpu / sentences * 1e3 if sentences else float("nan"),
        "p50_ms": float(np.percentile(lat, 50) * 1e3) if lat else float("nan"),
        "p99_ms": float(np.percentile(lat, 99) * 1e3) if lat else float("nan"),
        "errors": errors,
        "requests": done,
    }


def short_p50(running: Running, n: int) -> float:
    """p50 of one short text alone, one request at a time (nothing else in flight), seconds."""
    wire = request(running, [SHORT_TEXT]).wire()

    async def go() -> list[float]:
        reader, writer = await asyncio.open_connection(LOOPBACK, running.server.port)
        times = []
        try:
            for _ in range(n + 5):
                start = time.perf_counter()
                writer.write(wire)
                status, _ = await _read_response(reader)
                if status != 200:
                    raise RuntimeError(f"{running.name} answered {status} to the short text")
                times.append(time.perf_counter() - start)
        finally:
            writer.close()
        return times[5:]

    return statistics.median(asyncio.run(go()))
