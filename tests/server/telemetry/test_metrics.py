"""app/server/telemetry/metrics.py: exact counts after known requests, the model gauges, several workers' sums (multiprocess
mode), and dead workers' live gauges reaped. Route labels are the middleware's (test_observability.py); the
/metrics route itself is tests/server/api/test_metrics.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess

from app.server.telemetry import metrics
from tests.live_server import ROOT, cli_server, server_env
from tests.server.prometheus import Samples, delta, parse, scrape, value

MODEL_NAMES = ["encoder", "encoder-preln", "layernorm"]
V2_INFER = {"inputs": [{"name": "input", "shape": [2, 3], "datatype": "FP32", "data": [0.2, 0.1, 0.3, 0.5, 0.1, 0.1]}]}


def test_known_requests_show_as_exact_counts_per_route_and_status(client: httpx.Client) -> None:
    before = scrape(client)
    for rows in (2, 3, 4):  # 9 rows in all
        assert client.post("/normalize", json={"data": [[0.5, 1.0, 2.0]] * rows}).status_code == 200
    assert client.post("/normalize", json={"data": [[0.2, 0.1, 0.3], [0.5, 0.1]]}).status_code == 422
    assert client.post("/normalize", json={"data": [[0.2, 0.1]], "eps": -1}).status_code == 422
    assert client.post("/v2/models/layernorm/infer", json=V2_INFER).status_code == 200  # 2 rows
    after = scrape(client)

    expected = [("/normalize", "200", 3), ("/normalize", "422", 2), ("/v2/models/{name}/infer", "200", 1)]
    for route, status, n in expected:
        labels = {"method": "POST", "route": route, "status": status}
        assert delta(before, after, "normserve_http_requests_total", **labels) == n
        assert delta(before, after, "normserve_http_request_duration_seconds_count", **labels) == n
        assert delta(before, after, "normserve_http_request_duration_seconds_bucket", le="+Inf", **labels) == n
        assert delta(before, after, "normserve_http_request_duration_seconds_sum", **labels) > 0
    # The invalid requests never reach onnxruntime: 3 + 1 runs of 2 + 3 + 4 + 2 rows.
    assert delta(before, after, "normserve_inference_duration_seconds_count", model="layernorm", version="1") == 4
    assert delta(before, after, "normserve_inference_batch_size_count", model="layernorm", version="1") == 4
    assert delta(before, after, "normserve_inference_batch_size_sum", model="layernorm", version="1") == 11
    assert delta(before, after, "normserve_inference_batch_size_bucket", model="layernorm", version="1", le="4.0") == 4
    assert value(after, "normserve_inference_requests_in_flight") == 0


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_model_load_time_and_warm_up_parity_are_gauges(client: httpx.Client, model: str) -> None:
    samples = scrape(client)
    assert value(samples, "normserve_model_load_seconds", model=model, version="1") > 0
    assert 0 <= value(samples, "normserve_model_parity_max_abs_diff", model=model, version="1") < 1e-4
    assert ("normserve_model_parity_max_abs_diff", (("model", model), ("version", "1"))) in samples
    tolerance = value(samples, "normserve_model_parity_tolerance", model=model, version="1")
    # The encoders' is NORMSERVE_VALIDATE_ATOL; layernorm's is 1e-5 and the float32 ulp of its warm-up output.
    assert tolerance == 1e-4 if model.startswith("encoder") else 1e-5 < tolerance < 1e-4
    assert value(samples, "normserve_model_ready", model=model, version="1") == 1


def test_a_ready_worker_shows_ready_and_its_in_flight_limit(client: httpx.Client) -> None:
    samples = scrape(client)
    assert value(samples, "normserve_ready") == 1
    assert value(samples, "normserve_inference_requests_in_flight_limit") == 64  # NORMSERVE_MAX_IN_FLIGHT's default


@pytest.mark.parametrize("tolerance", [None, 2.5e-5])
def test_record_model_sets_the_tolerance_only_when_given(tolerance: float | None) -> None:
    metrics.record_model("m-tolerance", str(tolerance), 0.5, 1e-6, tolerance)
    labels = {"model": "m-tolerance", "version": str(tolerance)}
    assert REGISTRY.get_sample_value("normserve_model_parity_max_abs_diff", labels) == 1e-6
    assert REGISTRY.get_sample_value("normserve_model_parity_tolerance", labels) == tolerance


# ---- several workers: prometheus-client's multiprocess mode -----------------------------------


def _pids_with(directory: Path, kind: str) -> set[int]:
    return {int(m.group(1)) for f in directory.iterdir() if (m := re.fullmatch(rf"{kind}_(\d+)\.db", f.name))}


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    """`normserve serve --workers 2` on a free loopback port; TMPDIR shows where its metrics directory goes."""
    tmp = tmp_path_factory.mktemp("workers")
    env = server_env({"TMPDIR": str(tmp)})
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    cli = Path(sys.executable).parent / "normserve"
    with cli_server([str(cli), "serve", "--workers", "2"], env) as server:
        yield server.base, tmp, server.proc


def test_metrics_total_every_worker_whichever_answers(two_workers: tuple[str, Path, subprocess.Popen[bytes]]) -> None:
    base, tmp, _ = two_workers
    (directory,) = tmp.glob("normserve-metrics-*")
    sent, deadline = 0, time.monotonic() + 30
    # A new connection per request lets either worker accept it; go on until both are up and have answered.
    while sent < 20 or len(_pids_with(directory, "counter")) < 2 or len(_pids_with(directory, "gauge_livemax")) < 2:
        assert time.monotonic() < deadline and sent < 500, "one worker answered every request"
        r = httpx.post(base + "/normalize", json={"data": [[1.0, 2.0, 4.0]]}, headers={"Connection": "close"})
        assert r.status_code in (200, 503)  # 503: the other worker may still be warming up
        sent += 1
    for _ in range(4):  # each scrape may land on either worker: every one reports the same totals
        with httpx.Client(base_url=base, headers={"Connection": "close"}) as c:
            samples = scrape(c)
        answered = sum(
            v
            for (name, labels), v in samples.items()
            if name == "normserve_http_requests_total" and ("route", "/normalize") in labels
        )
        assert answered == sent
        assert value(samples, "normserve_inference_requests_in_flight") == 0
        assert all(value(samples, "normserve_model_load_seconds", model=m, version="1") > 0 for m in MODEL_NAMES)
        # Both workers are ready (the least ready one counts), and their limits add up as their in-flight gauges do.
        assert value(samples, "normserve_ready") == 1
        assert value(samples, "normserve_inference_requests_in_flight_limit") == 2 * 64


def test_serve_removes_its_metrics_directory_when_it_stops(
    two_workers: tuple[str, Path, subprocess.Popen[bytes]],
) -> None:
    _, tmp, proc = two_workers
    assert list(tmp.glob("normserve-metrics-*"))
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    assert not list(tmp.glob("normserve-metrics-*"))


# ---- dead workers' live gauges ---------------------------------------------------------------

_WORKER = """
import sys
import app.server.telemetry.metrics as m
m.IN_FLIGHT.inc()
m.observe_request("GET", "/x", 200, 0.01)
print("ready", flush=True)
sys.stdin.read() if sys.argv[1] == "alive" else None
import os; os._exit(0)  # no clean-up: as if killed
"""


@pytest.mark.parametrize(("state", "gauge_kept"), [("dead", False), ("alive", True)])
def test_reaping_drops_only_dead_workers_live_gauges_and_keeps_their_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str, gauge_kept: bool
) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    cmd = [sys.executable, "-c", _WORKER, state]
    worker = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert worker.stdout is not None and worker.stdout.readline() == b"ready\n"
        if state == "dead":
            worker.wait(timeout=30)
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
        assert metrics.reap_dead_workers() == ([] if gauge_kept else [worker.pid])
        assert (tmp_path / f"gauge_livesum_{worker.pid}.db").exists() == gauge_kept
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, str(tmp_path))  # type: ignore[no-untyped-call]
        samples: Samples = parse(generate_latest(registry).decode())
        assert value(samples, "normserve_http_requests_total", method="GET", route="/x", status="200") == 1
        assert value(samples, "normserve_inference_requests_in_flight") == (1 if gauge_kept else 0)
    finally:
        worker.communicate(b"", timeout=30)  # ends the live one (stdin closes) and closes the pipes
