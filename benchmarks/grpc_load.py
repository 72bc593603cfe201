"""Closed-loop gRPC load on 127.0.0.1: N clients, each on its own channel, sending the next ModelInfer on the answer.

The gRPC rows of section 3 beside HTTP binary and JSON. As the HTTP loop keeps the client cheap (raw asyncio
instead of httpx), this one sends a request serialized once and takes the answer as bytes (no protobuf parsing in
the hot loop): grpc.aio's own cost stays, which any Python gRPC client pays. `check` parses and verifies the
answer once before the cell is timed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

from benchmarks.load import LOOPBACK, LoadResult

INFER = "/inference.GRPCInferenceService/ModelInfer"
OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def infer_request(x: np.ndarray, model: str = "layernorm") -> bytes:
    """A ModelInfer of x (FP32, raw) asking for `output` alone, as the V2 requests of the HTTP rows do."""
    r = pb.ModelInferRequest(model_name=model)
    r.inputs.add(name="input", datatype="FP32", shape=x.shape)
    r.outputs.add(name="output")
    r.raw_input_contents.append(np.ascontiguousarray(x, np.float32).tobytes())
    return bytes(r.SerializeToString())


def output_of(answer: bytes) -> np.ndarray:
    response = pb.ModelInferResponse.FromString(answer)
    i = next(i for i, o in enumerate(response.outputs) if o.name == "output")
    return np.frombuffer(response.raw_output_contents[i], np.float32).reshape(list(response.outputs[i].shape))


async def _client(
    port: int, request: bytes, deadline: float, max_requests: int, latencies: list[float], errors: list[int]
) -> None:
    async with grpc.aio.insecure_channel(f"{LOOPBACK}:{port}", options=OPTIONS) as channel:
        call = channel.unary_unary(INFER)  # bytes in, bytes out
        while time.perf_counter() < deadline and len(latencies) + errors[0] < max_requests:
            start = time.perf_counter()
            try:
                await call(request, timeout=max(1.0, deadline - start + 30))
            except grpc.aio.AioRpcError:
                errors[0] += 1
                continue
            latencies.append(time.perf_counter() - start)


async def run_load(port: int, request: bytes, concurrency: int, seconds: float, max_requests: int) -> LoadResult:
    latencies: list[float] = []
    errors = [0]
    start = time.perf_counter()
    deadline = start + seconds
    clients = (_client(port, request, deadline, max_requests, latencies, errors) for _ in range(concurrency))
    await asyncio.gather(*clients)
    return LoadResult(len(latencies), errors[0], time.perf_counter() - start, np.asarray(latencies))


def load(port: int, request: bytes, concurrency: int, seconds: float, max_requests: int = 1_000_000) -> LoadResult:
    """run_load on a fresh event loop (asyncio's own: grpc.aio's client is measured as shipped)."""
    return asyncio.run(run_load(port, request, concurrency, seconds, max_requests))


def check(port: int, request: bytes, verify: Callable[[np.ndarray], None] | None = None) -> bytes:
    """One call: the cell's request must answer OK (and pass verify) before it is timed."""
    with grpc.insecure_channel(f"{LOOPBACK}:{port}", options=OPTIONS) as channel:
        answer: bytes = channel.unary_unary(INFER)(request, timeout=120)
    if verify is not None:
        verify(output_of(answer))
    return answer
