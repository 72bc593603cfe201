"""Memory bounded on every transport (issue 22, item 1; spec section 11): a worker's peak RSS for one big request
stays within 4x its body, and request bodies past NORMSERVE_MAX_INFLIGHT_BYTES wait, then get 503 /
RESOURCE_EXHAUSTED with Retry-After, on real servers (peak RSS from /proc/PID/status, VmHWM reset before each
request through /proc/PID/clear_refs).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest

from app.core.reference import layer_norm
from benchmarks import grpc_load
from benchmarks.servers import free_port, memory_kib
from tests.live_server import server_process

HEADER_LENGTH = "Inference-Header-Content-Length"
LN = "/v2/models/layernorm/infer"
BIG = 32 * 2**20  # bytes of float32 per big request: 8 Mi values


@dataclass
class Served:
    base: str
    grpc_port: int
    pid: int


def v2_binary(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
    head = json.dumps({"inputs": [tensor], "outputs": [{"name": "output", "parameters": {"binary_data": True}}]})
    return head.encode() + x.tobytes(), {HEADER_LENGTH: str(len(head))}


def http_output(base: str, x: np.ndarray) -> np.ndarray:
    body, headers = v2_binary(x)
    r = httpx.post(base + LN, content=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return np.frombuffer(r.content[int(r.headers[HEADER_LENGTH]) :], np.float32).reshape(x.shape)


def grpc_output(port: int, x: np.ndarray) -> np.ndarray:
    return grpc_load.output_of(grpc_load.check(port, grpc_load.infer_request(x)))


def json_output(base: str, x: np.ndarray) -> np.ndarray:
    body = orjson.dumps({"data": x}, option=orjson.OPT_SERIALIZE_NUMPY)
    r = httpx.post(base + "/normalize", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text
    return np.asarray(orjson.loads(r.content)["output"], np.float32)


def reset_peak(pid: int) -> int:
    """VmHWM := VmRSS now, and that figure in bytes."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return memory_kib(pid)["VmHWM"] * 1024


@pytest.fixture(scope="module")
def big() -> Iterator[Served]:
    grpc_port = free_port()
    with server_process({"NORMSERVE_GRPC_PORT": str(grpc_port)}) as (base, proc):
        yield Served(base, grpc_port, proc.pid)


@pytest.mark.parametrize("transport", ["http-binary", "grpc"])
def test_one_big_request_peaks_within_4x_its_body(big: Served, transport: str) -> None:
    x = np.random.default_rng(1).standard_normal((BIG // 4096, 1024)).astype(np.float32)
    send = (lambda: http_output(big.base, x)) if transport == "http-binary" else lambda: grpc_output(big.grpc_port, x)
    send()  # the first big request's one-time allocations (arenas, buffers) are not per request
    rest = reset_peak(big.pid)
    out = send()
    peak = memory_kib(big.pid)["VmHWM"] * 1024
    np.testing.assert_allclose(out[:64], layer_norm(x[:64].astype(np.float64)).output, atol=1e-4)
    assert peak - rest <= 4 * x.nbytes, f"{transport}: +{(peak - rest) / 2**20:.0f} MiB for {x.nbytes / 2**20} MiB"


def test_one_big_json_request_peaks_within_4x_its_body_on_a_fresh_worker() -> None:
    # As scripts/peak_memory.py measures: a worker's first big request, its one-time allocations included.
    # The body, simdjson's copy of it and its tape (16 bytes a number) took this to 5x before the tensor
    # was parsed in pieces.
    x = np.random.default_rng(1).standard_normal((BIG // (11 * 1024), 1024)).astype(np.float32)
    size = len(orjson.dumps({"data": x}, option=orjson.OPT_SERIALIZE_NUMPY))  # about BIG: 11 bytes a value
    with server_process({}) as (base, proc):
        json_output(base, np.ones((2, 8), np.float32))
        rest = reset_peak(proc.pid)
        out = json_output(base, x)
        peak = memory_kib(proc.pid)["VmHWM"] * 1024
    np.testing.assert_allclose(out[:64], layer_norm(x[:64].astype(np.float64)).output, atol=1e-4)
    assert peak - rest <= 4 * size, f"+{(peak - rest) / 2**20:.0f} MiB for {size / 2**20:.1f} MiB"


BUDGET = 4 * 2**20


@pytest.fixture(scope="module")
def budgeted() -> Iterator[Served]:
    grpc_port = free_port()
    env = {"NORMSERVE_MAX_INFLIGHT_BYTES": str(BUDGET), "NORMSERVE_GRPC_PORT": str(grpc_port)}
    with server_process(env) as (base, proc):
        yield Served(base, grpc_port, proc.pid)


def hold_budget(base: str) -> socket.socket:
    """An upload announcing the whole budget that sends its head and 1 KiB, then stalls: its bytes are counted."""
    host, port = base.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    head = f"POST {LN} HTTP/1.1\r\nHost: normserve\r\nContent-Length: {BUDGET}\r\n{HEADER_LENGTH}: 100\r\n\r\n"
    s.sendall(head.encode() + b"{" * 1024)
    time.sleep(0.3)  # the route has started reading it
    return s


def refused(what: str) -> str:
    return (
        f"{what} would pass the limit of {BUDGET} bytes of request bodies in flight"
        f" ({BUDGET} now, NORMSERVE_MAX_INFLIGHT_BYTES); retry shortly"
    )


def over_http(served: Served, x: np.ndarray) -> tuple[Any, ...]:
    body, headers = v2_binary(x)
    r = httpx.post(served.base + LN, content=body, headers=headers, timeout=30)
    if r.status_code != 200:
        return r.status_code, r.headers.get("retry-after"), r.json()
    return (200,)


def over_grpc(served: Served, x: np.ndarray) -> tuple[Any, ...]:
    body = grpc_load.infer_request(x)
    try:
        grpc_load.check(served.grpc_port, body)
    except grpc.RpcError as e:
        trailers = dict(e.trailing_metadata() or ())  # type: ignore[attr-defined]
        return e.code(), trailers.get("retry-after"), e.details()  # type: ignore[attr-defined]
    return (grpc.StatusCode.OK,)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_body_past_the_budget_waits_then_is_refused_with_retry_after_and_served_once_there_is_room(
    budgeted: Served, transport: str
) -> None:
    x = np.ones((256, 1024), np.float32)  # 1 MiB
    if transport == "http":
        send, ok = over_http, (200,)
        expected: tuple[Any, ...] = (503, "1", {"error": refused(f"{len(v2_binary(x)[0])} more bytes")})
    else:  # read only once the largest message fits (NORMSERVE_MAX_BODY_BYTES: 64 MiB)
        send, ok = over_grpc, (grpc.StatusCode.OK,)
        what = "a message of up to 67108864 bytes (NORMSERVE_MAX_BODY_BYTES)"
        expected = (grpc.StatusCode.RESOURCE_EXHAUSTED, "1", refused(what))
    holder = hold_budget(budgeted.base)
    try:
        start = time.monotonic()
        assert send(budgeted, x) == expected
        assert time.monotonic() - start >= 0.9  # it waited for room first
    finally:
        holder.close()
    time.sleep(0.3)  # the stalled upload's bytes are given back once its connection is gone
    assert send(budgeted, x) == ok
