"""app/server/worker.py: start (load, warm up, ready), model lookup, run (admission, threads, timeout), serve.

The workers here are real: Settings and the repo's exported models (or a copy of them with one thing broken),
driven by asyncio directly. The jobs handed to `Worker.run` are what a route hands it, or a job that blocks
until the test releases it, which is how a long inference looks to the worker.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
import numpy as np
import orjson
import pytest
from prometheus_client import REGISTRY

from app.core.dataplane import NormalizeInput
from app.core.model import Model
from app.core.runtime import Runtime
from app.core.seeds import SEED003
from app.errors import InvalidInput, ModelNotFound, NormserveError, NotReady, Overloaded, Timeout, status_for
from app.server.api.rest import codec
from app.server.telemetry.timer import STAGES
from app.server.worker import INLINE_BODY_BYTES, Worker, arrived
from app.settings import Settings
from tests.live_server import MODELS, live_server
from tests.repositories import BROKEN, add_version, broken_copy, copy_models, not_ready_reason
from tests.server.log_records import captured
from tests.server.stages import Stages

MODEL_NAMES = ["encoder", "encoder-preln", "layernorm"]
WAIT_S = 10.0  # the longest a blocked job or a wait here lasts, so that a failing test never hangs


def started(**settings: Any) -> Worker:
    """A worker on the repo's models, started as the app's lifespan starts it."""
    worker = Worker(Settings(model_dir=MODELS, **settings))
    worker.start()
    assert worker.admission.ready, worker.admission.not_ready_reason
    return worker


@pytest.fixture(scope="module")
def ready_worker() -> Worker:
    """One started worker for the tests that leave it as they found it."""
    return started()


class Blocked:
    """A job that runs until the test releases it, noting the thread it ran on."""

    def __init__(self, result: str = "done") -> None:
        self.result = result
        self.started = threading.Event()
        self.release = threading.Event()
        self.thread: int | None = None

    def __call__(self) -> str:
        self.thread = threading.get_ident()
        self.started.set()
        if not self.release.wait(WAIT_S):
            raise RuntimeError("the test never released this job")
        return self.result


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.005)


def in_flight_gauge() -> float:
    value = REGISTRY.get_sample_value("normserve_inference_requests_in_flight")
    assert value is not None
    return value


@pytest.fixture
def lifecycle_log() -> Iterator[list[logging.LogRecord]]:
    """The records of the `normserve` logger (the worker's start-up lines) while the test runs."""
    with captured("normserve") as records:
        yield records


def own_lines(records: list[logging.LogRecord], level: int) -> list[logging.LogRecord]:
    return [r for r in records if r.name == "normserve" and r.levelno == level]


# ---- start: verify sha256 -> sessions -> parity warm-up -> ready ------------------------------------------


def test_start_verifies_warms_up_and_then_makes_the_worker_ready(lifecycle_log: list[logging.LogRecord]) -> None:
    worker = Worker(Settings(model_dir=MODELS))
    assert (worker.admission.ready, worker.admission.not_ready_reason) == (False, "models are loading")
    worker.start()
    assert worker.admission.ready and worker.admission.accepting
    assert [(m.name, m.version) for m in worker.runtime.models] == [(name, "1") for name in MODEL_NAMES]
    assert {name: sorted(versions) for name, versions in worker.runtime.serving.items()} == {
        name: [1] for name in MODEL_NAMES
    }
    (ready,) = own_lines(lifecycle_log, logging.INFO)
    diffs: dict[str, float] = vars(ready)["parity_max_abs_diff"]  # an `extra` field of the record, by name/version
    assert sorted(diffs) == sorted(f"{name}/1" for name in MODEL_NAMES) and all(0 <= d < 1e-4 for d in diffs.values())
    loaded = [r.getMessage() for r in lifecycle_log if r.name == "normserve.models" and r.levelno == logging.INFO]
    assert [m.split(" (sha256")[0] for m in loaded] == [f"loaded model {name} version 1" for name in MODEL_NAMES]
    for model in worker.runtime.models:  # the gauges of /metrics hold what this start measured
        labels = {"model": model.name, "version": model.version}
        assert REGISTRY.get_sample_value("normserve_model_load_seconds", labels) == model.load_seconds > 0
        assert REGISTRY.get_sample_value("normserve_model_parity_max_abs_diff", labels) == diffs[f"{model.name}/1"]
        assert REGISTRY.get_sample_value("normserve_model_ready", labels) == 1.0


@pytest.mark.parametrize("how", BROKEN)
def test_start_with_a_broken_model_dir_leaves_the_worker_live_but_not_ready_with_the_reason(
    tmp_path: Path, lifecycle_log: list[logging.LogRecord], how: str
) -> None:
    models = broken_copy(tmp_path, how)
    reason = not_ready_reason(models, how)
    worker = Worker(Settings(model_dir=models))
    worker.start()  # returns, so the process goes on serving liveness and this reason
    assert (worker.admission.ready, worker.admission.not_ready_reason) == (False, reason)
    (line,) = own_lines(lifecycle_log, logging.ERROR)
    assert line.getMessage() == "not ready: " + reason.removeprefix("model check failed: ")
    assert vars(line)["reason"] == reason
    broken = "encoder" if how == "missing" else "layernorm"
    with pytest.raises(NotReady) as e:
        worker.model(broken)
    assert e.value.message == f"server is not ready: {reason}"
    # Strict readiness, but the models that loaded serve (as Triton's do): no 503 for a request to them.
    assert [m.name for m in worker.runtime.models] == [n for n in MODEL_NAMES if n != broken]
    assert worker.model("encoder-preln").name == "encoder-preln"
    worker.admission.enter()
    worker.admission.leave()


def test_start_with_weights_that_fail_the_parity_warm_up_is_not_ready(tmp_path: Path) -> None:
    models = tmp_path / "models"
    copy_models(models)
    folder = models / "encoder/1"
    manifest = json.loads((folder / "manifest.json").read_text())
    with np.load(folder / "weights.npz") as npz:
        weights = {k: npz[k] for k in npz.files}
    name = next(k for k in sorted(weights) if k.endswith("weight") and weights[k].ndim == 2)
    np.savez(folder / "weights.npz", **{**weights, name: weights[name] * 1.01})  # the reference now differs
    manifest["files"]["weights.npz"] = hashlib.sha256((folder / "weights.npz").read_bytes()).hexdigest()  # sha256 ok
    (folder / "manifest.json").write_text(json.dumps(manifest))
    model = Runtime(Settings(model_dir=models)).build("encoder", 1)  # built: sha256 and session pass
    diff, atol = model.warm_up()  # the same fixed-input warm-up, run here once more
    assert diff > atol
    labels = {"model": "encoder", "version": "1"}
    failures = REGISTRY.get_sample_value("normserve_model_load_failures_total", labels) or 0.0
    worker = Worker(Settings(model_dir=models))
    worker.start()
    assert not worker.admission.ready
    assert worker.admission.not_ready_reason == (
        f"model check failed: encoder/1/model.onnx: parity warm-up failed, max abs diff {diff:.3g} > {atol:.3g}"
    )
    assert [m.name for m in worker.runtime.models] == ["encoder-preln", "layernorm"]  # the others serve
    assert REGISTRY.get_sample_value("normserve_model_load_failures_total", labels) == failures + 1


def test_warm_up_runs_show_in_the_inference_metric_but_are_no_executions_of_the_statistics() -> None:
    def warm_up_runs() -> float:
        labels = {"model": "layernorm", "version": "1"}
        return REGISTRY.get_sample_value("normserve_inference_duration_seconds_count", labels) or 0.0

    before = warm_up_runs()
    worker = started()
    assert warm_up_runs() > before
    stats = worker.statistics.report([(name, "1") for name in MODEL_NAMES])["model_stats"]
    assert [s["execution_count"] for s in stats] == [0, 0, 0]


# ---- model: 404 for an unknown model, but 503 while the models are still loading ------------------------


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("layernorm", None),
        ("layernorm", "1"),
        ("layernorm", 1),
        ("layernorm", ""),
        ("encoder", None),
        ("encoder-preln", "1"),
    ],
)
def test_model_of_a_ready_worker_is_the_loaded_model(
    ready_worker: Worker, name: str, version: str | int | None
) -> None:
    model = ready_worker.model(name, version)
    assert model is ready_worker.runtime.serving[name][1] and model.version == "1"


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("gpt", None, "model: unknown model 'gpt'; available: encoder, encoder-preln, layernorm"),
        ("layernorm", "2", "version: model 'layernorm' has no ready version '2'; ready: 1"),
        ("encoder", 7, "version: model 'encoder' has no ready version 7; ready: 1"),
    ],
)
def test_model_unknown_to_a_ready_worker_is_not_found_404(
    ready_worker: Worker, name: str, version: str | int | None, message: str
) -> None:
    with pytest.raises(ModelNotFound) as e:
        ready_worker.model(name, version)
    assert e.value.message == message
    assert status_for(e.value, v2=False) == status_for(e.value, v2=True) == 404


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("layernorm", "1e9", "version: expected a positive integer version (1..2147483647), got '1e9'"),
        ("layernorm", "01", "version: expected a positive integer version (1..2147483647), got '01'"),
        ("layernorm", 0, "version: expected a positive integer version (1..2147483647), got 0"),
        ("layernorm", "2147483648", "version: expected a positive integer version (1..2147483647), got '2147483648'"),
        ("../models", None, "model: expected a model name matching [A-Za-z0-9][A-Za-z0-9_.-]{0,63}, got '../models'"),
    ],
)
def test_a_malformed_name_or_version_is_invalid_422_or_400(
    ready_worker: Worker, name: str, version: str | int | None, message: str
) -> None:
    with pytest.raises(InvalidInput) as e:
        ready_worker.model(name, version)
    assert e.value.message == message
    assert (status_for(e.value, v2=False), status_for(e.value, v2=True)) == (422, 400)


@pytest.mark.parametrize(("name", "version"), [("layernorm", None), ("gpt", None), ("layernorm", "2")])
def test_model_while_the_models_are_loading_is_not_ready_503_even_if_unknown(name: str, version: str | None) -> None:
    worker = Worker(Settings(model_dir=MODELS))  # not started: nothing is loaded yet
    with pytest.raises(NotReady) as e:
        worker.model(name, version)
    assert e.value.message == "server is not ready: models are loading"
    assert status_for(e.value, v2=False) == status_for(e.value, v2=True) == 503


# ---- run: admission, the threadpool or the event loop, the timeout ----------------------------------------


def test_run_past_the_in_flight_limit_is_overloaded_at_once_not_queued() -> None:
    worker = started(max_in_flight=2)
    jobs = [Blocked(f"job {i}") for i in range(2)]

    async def scenario() -> list[str]:
        running = [asyncio.ensure_future(worker.run(job)) for job in jobs]
        await until(lambda: all(job.started.is_set() for job in jobs))
        third = Blocked()
        with pytest.raises(Overloaded) as e:
            await worker.run(third)  # answered while both others still run
        assert e.value.message == "2 requests in flight, the limit (NORMSERVE_MAX_IN_FLIGHT)"
        assert not third.started.is_set() and worker.admission.count() == 2
        for job in jobs:
            job.release.set()
        return list(await asyncio.gather(*running))

    assert asyncio.run(scenario()) == ["job 0", "job 1"]
    assert worker.admission.count() == 0
    assert asyncio.run(worker.run(lambda: "admitted again")) == "admitted again"


@pytest.mark.parametrize(
    ("deadline_s", "waited_s", "message"),
    [
        (None, 0.3, "inference took longer than 0.3 s (NORMSERVE_REQUEST_TIMEOUT_S)"),
        (0.1, 0.1, "inference took longer than the client's deadline (0.1 s)"),  # a gRPC client's shorter one
        (5.0, 0.3, "inference took longer than 0.3 s (NORMSERVE_REQUEST_TIMEOUT_S)"),  # the setting still bounds
    ],
    ids=["setting", "shorter-deadline", "longer-deadline"],
)
def test_run_past_the_timeout_is_a_timeout_and_the_job_keeps_its_slot_until_it_ends(
    deadline_s: float | None, waited_s: float, message: str
) -> None:
    worker = started(request_timeout_s=0.3)
    job = Blocked()
    gauge = in_flight_gauge()

    async def scenario() -> None:
        t0 = time.monotonic()
        with pytest.raises(Timeout) as e:
            await worker.run(job, deadline_s=deadline_s)
        assert e.value.message == message
        assert waited_s <= time.monotonic() - t0 < waited_s + 2.0
        # A thread cannot be stopped: until the job really ends it still counts, so the limit still holds.
        assert job.started.is_set() and worker.admission.count() == 1 and in_flight_gauge() == gauge + 1
        job.release.set()
        await until(lambda: worker.admission.count() == 0 and in_flight_gauge() == gauge)

    asyncio.run(scenario())


def test_a_job_no_thread_took_before_the_timeout_frees_its_slot_at_once_and_never_runs() -> None:
    worker = started(request_timeout_s=0.2)
    occupant, job = Blocked(), Blocked()

    async def scenario() -> None:
        anyio.to_thread.current_default_thread_limiter().total_tokens = 1  # this event loop's pool: one thread
        occupying = asyncio.ensure_future(anyio.to_thread.run_sync(occupant))
        await until(occupant.started.is_set)
        with pytest.raises(Timeout) as e:
            await worker.run(job)  # waits for the one thread, which the occupant holds
        assert e.value.message == "inference took longer than 0.2 s (NORMSERVE_REQUEST_TIMEOUT_S)"
        assert worker.admission.count() == 0  # the waiter claimed the job: its slot is free now
        occupant.release.set()
        await occupying
        await asyncio.sleep(0.1)
        assert not job.started.is_set()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ("loading", "server is not ready: models are loading"),
        ("draining", "server is shutting down; retry on another replica"),
    ],
)
def test_run_on_a_worker_that_is_not_accepting_refuses_without_running_the_job(state: str, message: str) -> None:
    worker = Worker(Settings(model_dir=MODELS)) if state == "loading" else started()
    worker.admission.draining = state == "draining"  # what Drain sets on SIGTERM
    job = Blocked()
    job.release.set()
    gauge = in_flight_gauge()
    with pytest.raises(NotReady) as e:
        asyncio.run(worker.run(job))
    assert e.value.message == message
    assert not job.started.is_set() and worker.admission.count() == 0 and in_flight_gauge() == gauge


@pytest.mark.parametrize(("inline", "on_the_loop"), [(True, True), (False, False)], ids=["inline", "threadpool"])
def test_inline_jobs_run_on_the_event_loop_and_the_others_in_the_threadpool(
    ready_worker: Worker, inline: bool, on_the_loop: bool
) -> None:
    job = Blocked()
    job.release.set()

    async def scenario() -> tuple[str, int]:
        return await ready_worker.run(job, inline=inline), threading.get_ident()

    result, loop_thread = asyncio.run(scenario())
    assert result == "done" and (job.thread == loop_thread) == on_the_loop
    assert ready_worker.admission.count() == 0


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "threadpool"])
def test_a_job_that_raises_frees_its_slot_and_its_error_reaches_the_caller(ready_worker: Worker, inline: bool) -> None:
    def job() -> None:
        raise InvalidInput("row 1 has 2 elements, expected 3", "data")

    with pytest.raises(InvalidInput) as e:
        asyncio.run(ready_worker.run(job, inline=inline))
    assert e.value.message == "data: row 1 has 2 elements, expected 3"
    assert ready_worker.admission.count() == 0


def test_a_request_abandoned_by_a_timed_out_drain_is_not_ready_and_its_job_keeps_the_slot() -> None:
    worker = started()
    job = Blocked()

    async def scenario() -> None:
        running = asyncio.ensure_future(worker.run(job))
        await until(job.started.is_set)
        assert worker.admission.abandon_all() == 1  # what Drain does once its timeout passed
        with pytest.raises(NotReady) as e:
            await running
        assert e.value.message == (
            "server is shutting down and its drain timeout (NORMSERVE_DRAIN_TIMEOUT_S) passed; retry elsewhere"
        )
        assert worker.admission.count() == 1 and not worker.admission.abandonable
        job.release.set()
        await until(lambda: worker.admission.count() == 0)

    asyncio.run(scenario())


# ---- serve: statistics of the model the request named (codec.model) --------------------------------------


def normalize(worker: Worker, body: bytes) -> Coroutine[Any, Any, bytes]:
    """What POST /normalize hands the worker: it names its model before decoding, so a bad body counts as its
    failure."""
    return worker.serve(codec.NormalizeCodec(worker.model, worker.settings), arrived(body))


def counts(worker: Worker, name: str = "layernorm") -> tuple[int, int, int, int]:
    """inference_count, execution_count, success count, fail count."""
    (s,) = worker.statistics.report([(name, "1")])["model_stats"]
    inf = s["inference_stats"]
    return s["inference_count"], s["execution_count"], inf["success"]["count"], inf["fail"]["count"]


def test_serve_counts_a_success_and_each_stage_under_the_model_the_request_named() -> None:
    worker = started()
    answer = asyncio.run(normalize(worker, orjson.dumps({"data": SEED003.x})))
    np.testing.assert_allclose(orjson.loads(answer)["output"], SEED003.output, atol=1e-4)
    assert counts(worker) == (1, 1, 1, 0)
    (s,) = worker.statistics.report([("layernorm", "1")])["model_stats"]
    assert all(s["inference_stats"][stage]["count"] == 1 for stage in STAGES)
    assert counts(worker, "encoder") == counts(worker, "encoder-preln") == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param({"data": [[0.2, 0.1, 0.3], [0.5, 0.1]]}, "data: row 1 has 2 elements, expected 3", id="decode"),
        pytest.param(
            {"data": [[0.0, 1.0]], "gamma": [3e38, 3e38], "beta": [3e38, 3e38]},
            "output: the result is not finite in FP32 (it overflows);"
            " scale the input or gamma down, or use a larger eps",
            id="infer",
        ),
    ],
)
def test_serve_counts_a_request_that_fails_in_any_stage_as_one_failure(body: dict[str, Any], message: str) -> None:
    worker = started()
    with pytest.raises(InvalidInput) as e:
        asyncio.run(normalize(worker, orjson.dumps(body)))
    assert e.value.message == message
    inferences, _, successes, failures = counts(worker)
    assert (inferences, successes, failures) == (0, 0, 1)  # inference_count counts successes, as Triton's


@pytest.mark.parametrize("refusal", ["timeout", "overloaded"])
def test_serve_counts_a_request_refused_by_admission_or_the_timeout_as_a_failure(refusal: str) -> None:
    worker = started(max_in_flight=1, request_timeout_s=0.2)
    holder, job = Blocked(), Blocked()
    model = worker.model("layernorm")  # as V2 names it, before the request is admitted

    def decode(body: bytes) -> tuple[Model, NormalizeInput, None]:
        job()
        raise RuntimeError("released once its request was answered")  # no run: the request counts no execution

    blocking = Stages(decode, model=model, size=INLINE_BODY_BYTES + 1)  # to the threadpool, where the timeout is

    async def scenario() -> None:
        holding = asyncio.ensure_future(worker.run(holder)) if refusal == "overloaded" else None
        await until(lambda: holding is None or holder.started.is_set())
        expected: type[NormserveError] = Overloaded if refusal == "overloaded" else Timeout
        with pytest.raises(expected):
            await worker.serve(blocking, arrived(b""))
        holder.release.set()
        job.release.set()
        if holding is not None:
            await holding
        await until(lambda: worker.admission.count() == 0)

    asyncio.run(scenario())
    assert counts(worker) == (0, 0, 0, 1)


def test_serve_of_a_request_that_never_named_a_model_counts_for_no_model() -> None:
    worker = started()

    def decode(body: bytes) -> tuple[Model, NormalizeInput, None]:
        return worker.model("gpt"), NormalizeInput(np.ones((1, 2))), None

    with pytest.raises(ModelNotFound):
        asyncio.run(worker.serve(Stages(decode), arrived(b"")))
    assert [counts(worker, name) for name in MODEL_NAMES] == [(0, 0, 0, 0)] * 3


# ---- over HTTP: a server that admits one inference at a time, for at most 0.5 s -------------------------

SLOW = {"NORMSERVE_MAX_IN_FLIGHT": "1", "NORMSERVE_REQUEST_TIMEOUT_S": "0.5", "NORMSERVE_INTRA_OP_THREADS": "1"}
ENC_V2 = "/v2/models/encoder/infer"


@pytest.fixture(scope="module")
def one_at_a_time() -> Iterator[str]:
    with live_server(SLOW) as base:
        yield base


def slow_request() -> tuple[bytes, dict[str, str]]:
    """Seconds of encoder work on one thread: a V2 body of [32, 512, 128] floats in binary."""
    x = np.zeros((32, 512, 128), dtype=np.float32)
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
    head = json.dumps({"inputs": [tensor]}).encode()
    return head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))}


async def wait_admitting(client: httpx.AsyncClient) -> None:
    """Until the abandoned inference of an earlier test has really ended and a request is admitted again."""
    deadline = time.monotonic() + 60
    while (await client.post("/normalize", json={"data": [1, 2]})).status_code != 200:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)


async def overloaded(base: str) -> tuple[httpx.Response, httpx.Response, float, float]:
    body, headers = slow_request()
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        await wait_admitting(client)
        slow = asyncio.ensure_future(client.post(ENC_V2, content=body, headers=headers))
        await asyncio.sleep(0.2)  # the slow one is admitted and running
        t0 = time.monotonic()
        refused = await client.post("/normalize", json={"data": [1, 2]})
        refused_after = time.monotonic() - t0
        first = await slow
        return refused, first, refused_after, time.monotonic() - t0


def test_past_max_in_flight_is_503_with_retry_after_at_once(one_at_a_time: str) -> None:
    refused, first, refused_after, first_after = asyncio.run(overloaded(one_at_a_time))
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"] == "1 requests in flight, the limit (NORMSERVE_MAX_IN_FLIGHT)"
    assert refused_after < first_after, "the refused request waited for the running one: it was queued"


def test_past_the_request_timeout_is_504_and_the_worker_serves_on(one_at_a_time: str) -> None:
    body, headers = slow_request()

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=one_at_a_time, timeout=60) as client:
            await wait_admitting(client)
            timed_out = await client.post(ENC_V2, content=body, headers=headers)
            await wait_admitting(client)
            return timed_out, await client.post("/normalize", json={"data": SEED003.x[0]})

    timed_out, after = asyncio.run(scenario())
    assert timed_out.status_code == 504
    assert timed_out.json()["error"] == "inference took longer than 0.5 s (NORMSERVE_REQUEST_TIMEOUT_S)"
    assert after.status_code == 200
    np.testing.assert_allclose(after.json()["output"], SEED003.output[0], atol=1e-4)


def test_a_start_that_left_a_model_failing_is_ready_once_that_model_loads(tmp_path: Path) -> None:
    models = broken_copy(tmp_path, "tampered")
    worker = Worker(Settings(model_dir=models, model_control="explicit", admin_token="t"))
    worker.start()
    worker.settle()  # nothing changed: still not ready, for the same reason
    assert (worker.admission.ready, worker.admission.not_ready_reason) == (False, not_ready_reason(models, "tampered"))
    shutil.copy(MODELS / "layernorm/1/model.onnx", models / "layernorm/1/model.onnx")  # the file as exported
    worker.control.load("layernorm")
    worker.settle()
    assert worker.admission.ready and worker.model("layernorm").name == "layernorm"


@pytest.mark.parametrize(
    ("name", "version", "reported"),
    [
        (None, None, [("encoder", "1"), ("layernorm", "1"), ("layernorm", "2")]),
        ("layernorm", None, [("layernorm", "1"), ("layernorm", "2")]),  # every version, as Triton's: not the newest
        ("layernorm", "1", [("layernorm", "1")]),
    ],
    ids=["every-model", "one-model", "one-version"],
)
def test_statistics_of_a_model_are_of_each_version_serving(
    tmp_path: Path, name: str | None, version: str | None, reported: list[tuple[str, str]]
) -> None:
    root = copy_models(tmp_path / "models", ("layernorm", "encoder"))
    add_version(root, "layernorm", 2)
    (root / "layernorm/model.json").write_text(json.dumps({"version_policy": {"all": {}}}))
    worker = Worker(Settings(model_dir=root))
    worker.start()
    stats = worker.model_statistics(name, version)["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == reported


def test_a_numpy_backend_request_counts_as_its_models_inference_without_an_execution() -> None:
    """README, Logs: it names the model whose defaults it used, though no session ran."""
    worker = started()
    answer = orjson.loads(asyncio.run(normalize(worker, orjson.dumps({**SEED003.request(), "backend": "numpy"}))))
    np.testing.assert_allclose(answer["output"], SEED003.output, atol=1e-4)
    assert answer["model"] is None and counts(worker) == (1, 0, 1, 0)
