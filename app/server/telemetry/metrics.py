"""Prometheus metrics: requests per route (gRPC: per method) and status, inference per model, load, parity, readiness.

With several worker processes, prometheus-client's multiprocess mode sums the workers' files:
set PROMETHEUS_MULTIPROC_DIR (an empty directory) before the workers start; `normserve serve
--workers N` does so itself. Gauges say how they combine across workers (`multiprocess_mode`).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from app.server import group
from app.server.telemetry import monitoring

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_LATEST

# No *_created series: they double the output, and no dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

UNMATCHED = "unmatched"  # the route label of requests no route matched (404): never the raw path

# 0.5 ms to 60 s (the default request timeout): a small /normalize takes well under a millisecond.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = tuple(float(4**i) for i in range(12))  # 1 .. 4^11 rows (4M; a tensor holds at most 16M elements)

REQUESTS = Counter(
    "normserve_http_requests",
    "HTTP requests answered, by method, route template and status.",
    ["method", "route", "status"],
)
REQUEST_SECONDS = Histogram(
    "normserve_http_request_duration_seconds",
    "Time from receiving an HTTP request to sending the last byte of its response.",
    ["method", "route", "status"],
    buckets=LATENCY_BUCKETS,
)
IN_FLIGHT = Gauge(
    "normserve_inference_requests_in_flight",
    "Inference requests admitted and not yet finished (NORMSERVE_MAX_IN_FLIGHT bounds it per worker).",
    multiprocess_mode="livesum",
)
IN_FLIGHT_LIMIT = Gauge(
    "normserve_inference_requests_in_flight_limit",
    "NORMSERVE_MAX_IN_FLIGHT: inferences admitted at once before a 503, summed like the in-flight gauge.",
    multiprocess_mode="livesum",
)
# The scaling signals (docs/operations.md "Scaling"): requests admitted whose computation has not started, and how
# long they waited. Per model; a request whose body names its model (REST /normalize, /encode) is known to be its
# only once decoded, which is when its computation starts: it counts in the queue time, not in the pending gauge.
PENDING = Gauge(
    "normserve_pending_requests",
    "Inference requests admitted whose computation has not started, per model (summed over live workers).",
    ["model"],
    multiprocess_mode="livesum",
)
QUEUE_SECONDS = Histogram(
    "normserve_queue_seconds",
    "Time from a request's admission to the start of its computation (decode), per model.",
    ["model"],
    buckets=LATENCY_BUCKETS,
)
READY = Gauge(
    "normserve_ready",
    "1 while the worker takes inferences (GET /v2/health/ready is 200), 0 while loading, failed or draining "
    "(the least ready live worker).",
    multiprocess_mode="livemin",
)
INFERENCE_SECONDS = Histogram(
    "normserve_inference_duration_seconds",
    "onnxruntime run time of one inference, per model and version (the parity warm-up included).",
    ["model", "version"],
    buckets=LATENCY_BUCKETS,
)
BATCH_SIZE = Histogram(
    "normserve_inference_batch_size",
    "Rows (batch entries) per onnxruntime run, per model and version.",
    ["model", "version"],
    buckets=BATCH_BUCKETS,
)
LOAD_SECONDS = Gauge(
    "normserve_model_load_seconds",
    "Time to verify a model version's sha256 and build its session (the slowest live worker).",
    ["model", "version"],
    multiprocess_mode="livemax",
)
PARITY = Gauge(
    "normserve_model_parity_max_abs_diff",
    "Max abs difference from the NumPy reference in the load's warm-up (the worst live worker).",
    ["model", "version"],
    multiprocess_mode="livemax",
)
PARITY_TOLERANCE = Gauge(
    "normserve_model_parity_tolerance",
    "The tolerance of the parity warm-up's max abs difference (the strictest live worker).",
    ["model", "version"],
    multiprocess_mode="livemin",
)
# Model names and versions come from the repository's folders, never from a request: bounded by the operator.
LOAD_FAILURES = Counter(
    "normserve_model_load_failures",
    "Model version loads that failed (sha256, session or parity warm-up); what served keeps serving.",
    ["model", "version"],
)
MODEL_READY = Gauge(
    "normserve_model_ready",
    "1 while a model version takes traffic in this worker, 0 once unloaded (the least ready live worker).",
    ["model", "version"],
    multiprocess_mode="livemin",
)

# gRPC: `method` is one of the service's RPCs (grpc core answers unknown ones itself), `model` a loaded model's
# name or "" (an RPC that names none, or a name no model has), `code` a gRPC status code's name: all bounded.
GRPC_REQUESTS = Counter(
    "normserve_grpc_requests",
    "gRPC calls answered (a ModelStreamInfer message counts as one), by service, method, model and status code.",
    ["service", "method", "model", "code"],
)
GRPC_SECONDS = Histogram(
    "normserve_grpc_request_duration_seconds",
    "Time from receiving a gRPC request message to handing over its answer, by service, method and status code.",
    ["service", "method", "code"],
    buckets=LATENCY_BUCKETS,
)

# labels() takes a lock and hashes its arguments each call; the middleware calls it per request.
_request_children: dict[tuple[str, str, str], tuple[Counter, Histogram]] = {}
_grpc_children: dict[tuple[str, str, str, str], tuple[Counter, Histogram]] = {}
_inference_children: dict[tuple[str, str], tuple[Histogram, Histogram]] = {}
_queue_children: dict[str, tuple[Gauge, Histogram]] = {}


def queue(model: str) -> tuple[Gauge, Histogram]:
    """The model's pending gauge and queue-time histogram (cached children: each request moves both)."""
    children = _queue_children.get(model)
    if children is None:
        children = _queue_children.setdefault(model, (PENDING.labels(model), QUEUE_SECONDS.labels(model)))
    return children


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    """Count one answered HTTP request; route is the template (/v2/models/{name}/infer), never the raw path."""
    key = (method, route, str(status))
    children = _request_children.get(key)
    if children is None:
        children = _request_children.setdefault(key, (REQUESTS.labels(*key), REQUEST_SECONDS.labels(*key)))
    children[0].inc()
    children[1].observe(seconds)


def observe_grpc(service: str, method: str, model: str, code: str, seconds: float) -> None:
    """Count one answered gRPC call (or stream message) of a known method; model "" when it named no model."""
    key = (service, method, model, code)
    children = _grpc_children.get(key)
    if children is None:
        pair = (GRPC_REQUESTS.labels(*key), GRPC_SECONDS.labels(service, method, code))
        children = _grpc_children.setdefault(key, pair)
    children[0].inc()
    children[1].observe(seconds)


def observe_inference(model: str, version: str, seconds: float, batch_size: int) -> None:
    """One onnxruntime run of a model version (Model.run calls it for every run, merged batches included).

    The batch size is its rows, so a dynamically merged batch counts once with its merged size.
    Cached children, as for the requests: two labels() calls were ~25 us of a small request (cProfile)."""
    key = (model, version)
    children = _inference_children.get(key)
    if children is None:
        children = _inference_children.setdefault(key, (INFERENCE_SECONDS.labels(*key), BATCH_SIZE.labels(*key)))
    children[0].observe(seconds)
    children[1].observe(batch_size)


def record_model(
    model: str, version: str, load_seconds: float, parity_max_abs_diff: float, parity_tolerance: float | None = None
) -> None:
    """A version that loaded and passed its warm-up: its load time and parity figures; it takes traffic."""
    LOAD_SECONDS.labels(model, version).set(load_seconds)
    PARITY.labels(model, version).set(parity_max_abs_diff)
    if parity_tolerance is not None:
        PARITY_TOLERANCE.labels(model, version).set(parity_tolerance)
    MODEL_READY.labels(model, version).set(1)


def record_load_failure(model: str, version: str) -> None:
    LOAD_FAILURES.labels(model, version).inc()


def record_unload(model: str, version: str) -> None:
    MODEL_READY.labels(model, version).set(0)


def set_ready(accepting: bool) -> None:
    """The worker's readiness: never from a signal handler (the gauge takes a lock that the handler may interrupt)."""
    READY.set(1 if accepting else 0)


def multiprocess_dir() -> Path | None:
    value = os.environ.get(MULTIPROC_ENV)
    return Path(value) if value else None


@contextmanager
def multiprocess_dir_for(workers: int) -> Iterator[Path | None]:
    """For `normserve serve`: with several workers, a fresh PROMETHEUS_MULTIPROC_DIR, removed when they end.

    A directory the operator set is used as it is, emptied of a previous run's files first (which
    prometheus-client requires: stale files would add the old counts to the new ones).
    """
    existing = multiprocess_dir()
    if existing is not None:
        existing.mkdir(parents=True, exist_ok=True)
        for stale in existing.glob("*.db"):
            if not stale.name.endswith(f"_{os.getpid()}.db"):  # this process's own files are already open
                stale.unlink()
        yield existing
        return
    if workers <= 1:
        yield None
        return
    directory = tempfile.mkdtemp(prefix="normserve-metrics-")
    os.environ[MULTIPROC_ENV] = directory  # the workers inherit it and start in multiprocess mode
    try:
        yield Path(directory)
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(directory, ignore_errors=True)


def render() -> bytes:
    """The Prometheus text format of this worker, or of every worker in multiprocess mode (the drift monitor's
    series are this worker's: app/server/telemetry/monitoring.py)."""
    if multiprocess_dir() is None:
        return generate_latest(REGISTRY)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    registry.register(monitoring.COLLECTOR)
    return generate_latest(registry)


REGISTRY.register(monitoring.COLLECTOR)

_LIVE_FILE = re.compile(r"gauge_live\w+_(\d+)\.db")


def reap_dead_workers() -> list[int]:
    """Drop the live gauges of workers that died without cleaning up (killed, crashed); returns their pids.

    Counters and histograms of dead workers stay: their requests still happened. Each worker runs this
    as it starts, so a worker the server restarts clears the gauges of the one it replaces.
    """
    directory = multiprocess_dir()
    if directory is None or not directory.is_dir():
        return []
    pids = {int(m.group(1)) for f in directory.iterdir() if (m := _LIVE_FILE.fullmatch(f.name))}
    dead = sorted(pid for pid in pids if not group.alive(pid))
    for pid in dead:
        multiprocess.mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]
    return dead


def worker_exit() -> None:
    """A worker that shuts down cleanly removes its own live gauges."""
    if multiprocess_dir() is not None:
        multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]
