"""Sections 3 to 5, over HTTP (and gRPC) on 127.0.0.1: normserve beside its peers, dynamic batching, peak memory."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import numpy as np
import orjson

from app.core import reference
from app.core.halfprecision import ulp_errors
from benchmarks import grpc_load, servers
from benchmarks.inprocess import binary_request, sample
from benchmarks.load import Request, check, load

LAYERNORM_INFER = "/v2/models/layernorm/infer"
GRPC = "gRPC"  # ModelInfer with raw tensors on NORMSERVE_GRPC_PORT (benchmarks/grpc_load.py)
JSON = {"Content-Type": "application/json"}
TRACED = "normserve, tracing on"  # normserve exporting a span per request to a receiver on loopback
HALF = "V2 binary FP16"  # the V2 binary request in half precision, at the plan's largest shape (issue 26's row)
TRIVIAL = "trivial"  # the HTTP floor (benchmarks/peers/trivial_asgi.py): fed the /normalize body, answers a constant
# Which protocols each server speaks (the naive peer has only its /normalize; KServe and MLServer only V2).
PROTOCOLS = {
    "normserve": ("/normalize JSON", "V2 JSON", "V2 binary", HALF, GRPC),
    TRACED: ("/normalize JSON",),
    TRIVIAL: ("/normalize JSON",),
    "naive": ("/normalize JSON",),
    "kserve": ("V2 JSON", "V2 binary", GRPC),
    "mlserver": ("V2 JSON", GRPC),
}
MEMORY_PROTOCOLS = ("/normalize JSON", "V2 binary", GRPC)  # section 5: one large request each
MATCH_ATOL = 1e-4  # every server's answer is checked against the NumPy reference before it is timed
BINARY_DTYPES = {"FP32": np.float32, "FP16": np.float16}


@dataclass(frozen=True)
class HttpPlan:
    shapes: list[tuple[int, ...]]
    concurrencies: list[int]
    seconds: float
    servers: list[str]
    # Cells (server, shape, concurrency) too slow to be worth it in a quick run (a naive 2 s request x 8).
    skip: Callable[[str, tuple[int, ...], int], bool] = lambda server, shape, concurrency: False


def make_request(protocol: str, x: np.ndarray) -> Request:
    if protocol == "/normalize JSON":
        return Request("/normalize", orjson.dumps({"data": x}, option=orjson.OPT_SERIALIZE_NUMPY), JSON)
    if protocol == "V2 JSON":
        doc = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel()}]}
        doc["outputs"] = [{"name": "output"}]
        return Request(LAYERNORM_INFER, orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), JSON)
    header, blob = binary_request(x.astype(np.float16), "FP16") if protocol == HALF else binary_request(x)
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}
    return Request(LAYERNORM_INFER, header + blob, headers)


def output_of(protocol: str, response: httpx.Response) -> np.ndarray:
    """The normalized tensor of any server's answer, JSON or binary."""
    if protocol == "/normalize JSON":
        return np.asarray(response.json()["output"], np.float32)
    length = response.headers.get("inference-header-content-length")
    head = orjson.loads(response.content[: int(length)] if length else response.content)
    out = next(o for o in head["outputs"] if o["name"] == "output")
    if length:
        raw = response.content[int(length) : int(length) + out["parameters"]["binary_data_size"]]
        return np.frombuffer(raw, BINARY_DTYPES[out["datatype"]]).reshape(out["shape"])
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def _verifier(protocol: str, x: np.ndarray) -> Callable[[httpx.Response], None]:
    verify = array_verifier(protocol, x)
    return lambda response: verify(output_of(protocol, response))


def array_verifier(protocol: str, x: np.ndarray) -> Callable[[np.ndarray], None]:
    if protocol == HALF:
        return half_verifier(x.astype(np.float16))
    want = reference.layer_norm(x, 1, 1e-5, "var").output

    def verify(got: np.ndarray) -> None:
        diff = float(np.abs(got.reshape(want.shape) - want).max())
        if not diff <= MATCH_ATOL:
            raise RuntimeError(f"{protocol}: answer differs from the reference by {diff:.3g}")

    return verify


def half_verifier(x: np.ndarray) -> Callable[[np.ndarray], None]:
    """Checks an FP16 answer: within one FP16 ulp of float64 LayerNorm on the FP16 values x (issue 26)."""
    want = reference.layer_norm(x.astype(np.float64), 1, 1e-5, "var").output

    def verify(got: np.ndarray) -> None:
        worst = float(ulp_errors(got.reshape(want.shape), want, "FP16").max())
        if not worst <= 1:
            raise RuntimeError(f"{HALF}: answer differs from the reference by {worst:.3g} FP16 ulps")

    return verify


def http_section(plan: HttpPlan, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Section 3: every (server, protocol, shape, concurrency) cell, each server in turn, one worker each."""
    rows: list[dict[str, Any]] = []
    for name in plan.servers:
        grpc_port = servers.free_port() if GRPC in PROTOCOLS[name] else 0
        with _server(name, grpc_port) as srv:
            for protocol in PROTOCOLS[name]:
                for shape in plan.shapes:
                    if protocol == HALF and shape != plan.shapes[-1]:
                        continue
                    if all(plan.skip(name, shape, conc) for conc in plan.concurrencies):
                        continue
                    x = sample(shape)
                    run = _cell(protocol, srv.port, grpc_port, x, verify=name != TRIVIAL)
                    for conc in plan.concurrencies:
                        if plan.skip(name, shape, conc):
                            continue
                        cpu = servers.cpu_seconds(srv.pid)
                        result = run(conc, plan.seconds)
                        cpu = servers.cpu_seconds(srv.pid) - cpu
                        row = {"server": name, "protocol": protocol, "shape": shape, "concurrency": conc}
                        rows.append({**row, **load_row(result, cpu)})
                        log(f"{name:9} {protocol:16} {shape!s:15} c={conc:<3} {rows[-1]['rps']:9.1f} req/s")
    return rows


@contextmanager
def _server(name: str, grpc_port: int) -> Iterator[servers.Server]:
    """servers.serve(name), or normserve exporting its traces to a receiver that answers 200 (TRACED)."""
    if name != TRACED:
        with servers.serve(name, grpc_port=grpc_port) as srv:
            yield srv
        return
    with ok_receiver() as endpoint, servers.serve("normserve", {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}) as srv:
        yield srv


@contextmanager
def ok_receiver() -> Iterator[str]:
    """A throwaway OTLP/HTTP receiver on 127.0.0.1 that reads each export and answers 200; yields its endpoint."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per export otherwise
            pass

    server = ThreadingHTTPServer((servers.HOST, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://{servers.HOST}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _cell(protocol: str, port: int, grpc_port: int, x: np.ndarray, verify: bool) -> Callable[[int, float], Any]:
    """Check one answer of the cell's request against the reference, then hand back its load: (concurrency, s)."""
    if protocol == GRPC:
        message = grpc_load.infer_request(x)
        grpc_load.check(grpc_port, message, array_verifier(protocol, x))
        return lambda conc, seconds: grpc_load.load(grpc_port, message, conc, seconds)
    request = make_request(protocol, x)
    check(port, request, _verifier(protocol, x) if verify else None)
    return lambda conc, seconds: load(port, request, conc, seconds)


def batching_section(
    shapes: list[tuple[int, ...]],
    concurrencies: list[int],
    seconds: float,
    on: dict[str, str],
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Section 4: /encode with dynamic batching off, then on, at each shape and concurrency."""
    rows: list[dict[str, Any]] = []
    for label, env in (("off", {"NORMSERVE_BATCH_MAX_SIZE": "1"}), ("on", on)):
        with servers.serve("normserve", env) as srv:
            for shape in shapes:
                body = orjson.dumps({"data": sample(shape)}, option=orjson.OPT_SERIALIZE_NUMPY)
                request = Request("/encode", body, JSON)
                check(srv.port, request)
                for conc in concurrencies:
                    cpu, runs = servers.cpu_seconds(srv.pid), _encoder_runs(srv.port)
                    result = load(srv.port, request, conc, seconds)
                    cpu, runs = servers.cpu_seconds(srv.pid) - cpu, _encoder_runs(srv.port) - runs
                    row = {"batching": label, "shape": shape, "concurrency": conc, **load_row(result, cpu)}
                    # Requests per onnxruntime run: above 1 only when the batcher really merged requests.
                    row["requests_per_run"] = result.requests / runs if runs else float("nan")
                    rows.append(row)
                    log(f"encode batching {label:3} {shape!s:15} c={conc:<3} {rows[-1]['rps']:9.1f} req/s")
    return rows


def memory_section(payload_bytes: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Section 5: a fresh worker's peak RSS (VmHWM) while it serves one request of about payload_bytes."""
    rows = []
    env = {"NORMSERVE_MAX_BODY_BYTES": str(max(payload_bytes, 1 << 26))}
    for protocol in MEMORY_PROTOCOLS:
        grpc_port = servers.free_port() if protocol == GRPC else 0
        with servers.serve("normserve", env, grpc_port=grpc_port) as srv:
            payload = _sized_payload(protocol, payload_bytes)
            _send(_payload(protocol, sample((2, 8))), srv.port, grpc_port)  # warm: the first request's allocations
            idle = servers.memory_kib(srv.pid)
            start = time.perf_counter()
            _send(payload, srv.port, grpc_port)
            seconds = time.perf_counter() - start
            peak = servers.memory_kib(srv.pid)["VmHWM"] * 1024
            size = _size(payload)
            rows.append(
                {
                    "protocol": protocol,
                    "payload_bytes": size,
                    "idle_rss_bytes": idle["VmRSS"] * 1024,
                    "peak_rss_bytes": peak,
                    "seconds": seconds,
                }
            )
            log(f"memory {protocol:16} {size / 2**20:6.1f} MiB request: peak RSS {peak / 2**20:7.1f} MiB")
    return rows


def _encoder_runs(port: int) -> float:
    """onnxruntime runs of the encoder so far, from GET /metrics (normserve_inference_batch_size_count)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    prefix = 'normserve_inference_batch_size_count{model="encoder",version="1"}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def _payload(protocol: str, x: np.ndarray) -> Request | bytes:
    """The request of x: an HTTP request, or a serialized ModelInfer for gRPC."""
    return grpc_load.infer_request(x) if protocol == GRPC else make_request(protocol, x)


def _size(payload: Request | bytes) -> int:
    return len(payload) if isinstance(payload, bytes) else len(payload.body)


def _send(payload: Request | bytes, port: int, grpc_port: int) -> None:
    """One request, its answer 200 (gRPC: OK) or an error raised."""
    if isinstance(payload, bytes):
        grpc_load.check(grpc_port, payload)
    else:
        check(port, payload)


def _sized_payload(protocol: str, payload_bytes: int) -> Request | bytes:
    """A request just under payload_bytes: a ModelInfer's raw rows and its header of a few dozen bytes, or HTTP."""
    if protocol == GRPC:
        return grpc_load.infer_request(sample((max(1, payload_bytes // 4096 - 1), 1024), seed=1))
    return _sized_request(protocol, payload_bytes)


def _sized_request(protocol: str, payload_bytes: int) -> Request:
    """A request whose body is just under payload_bytes: rows of 1024 random float32 values."""
    per_row = len(make_request(protocol, sample((4, 1024))).body) / 4
    rows = max(1, int(payload_bytes * 0.995 / per_row))
    while True:
        request = make_request(protocol, sample((rows, 1024), seed=1))
        if len(request.body) <= payload_bytes:
            return request
        rows = int(rows * payload_bytes / len(request.body) * 0.999)


def load_row(result: Any, cpu_s: float) -> dict[str, Any]:
    return {
        "cpu_ms_per_request": cpu_s / result.requests * 1e3 if result.requests else float("nan"),
        "rps": result.rps,
        "p50_ms": result.percentile_ms(50),
        "p99_ms": result.percentile_ms(99),
        "errors": result.errors,
        "requests": result.requests,
    }


def stderr_log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)
