"""app/server/dataplane.py: model lookup, infer (admission, the threadpool or the event loop, the timeout) and
statistics of the model a request named.

The workers here are real: Settings and the repo's exported models, driven by asyncio directly. What they infer
is what a route hands the data plane, or a request whose decode stage is a job that blocks until the test
releases it, which is how a long inference looks to the worker.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
import httpx
import numpy as np
import orjson
import pytest
from prometheus_client import REGISTRY

from app.core.dataplane import EncodeInput, NormalizeInput
from app.core.model import Model
from app.core.seeds import SEED003
from app.errors import InvalidInput, ModelNotFound, NormserveError, NotReady, Overloaded, Timeout, status_for
from app.server.api.rest import codec
from app.server.dataplane import INLINE_BODY_BYTES
from app.server.telemetry.timer import STAGES
from app.server.worker import Worker
from app.settings import Settings
from tests.live_server import MODELS, live_server
from tests.polling import until
from tests.repositories import add_version, copy_models
from tests.server.stages import Stages
from tests.server.test_worker import MODEL_NAMES, WAIT_S, started

T = TypeVar("T")


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


def through(
    worker: Worker, fn: Callable[[], T], inline: bool = False, deadline_s: float | None = None, name: str = "layernorm"
) -> Awaitable[T]:
    """A request whose decode stage is fn, through the data plane's face: admitted, run on the event loop (inline:
    a tiny body) or in the threadpool, bounded by the timeout; its answer is fn's result. It counts in the
    statistics of the model `name`."""
    results: list[T] = []

    def decode(_: bytes) -> tuple[Model, Any, None]:
        model = worker.plane.runtime.get(name)
        results.append(fn())
        x = np.ones((1, 2), np.float32) if name == "layernorm" else np.zeros((1, 2, 128), np.float32)
        limits = getattr(model, "limits", None)
        return model, NormalizeInput(x) if name == "layernorm" else EncodeInput(x, None, limits), None

    size = 0 if inline else INLINE_BODY_BYTES + 1
    return worker.plane.infer(Stages(decode, lambda _, __: results[0], size=size), b"", deadline_s=deadline_s)


def in_flight_gauge() -> float:
    value = REGISTRY.get_sample_value("normserve_inference_requests_in_flight")
    assert value is not None
    return value


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
    model = ready_worker.plane.model(name, version)
    assert model is ready_worker.plane.runtime.serving[name][1] and model.version == "1"


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
        ready_worker.plane.model(name, version)
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
        ready_worker.plane.model(name, version)
    assert e.value.message == message
    assert (status_for(e.value, v2=False), status_for(e.value, v2=True)) == (422, 400)


@pytest.mark.parametrize(("name", "version"), [("layernorm", None), ("gpt", None), ("layernorm", "2")])
def test_model_while_the_models_are_loading_is_not_ready_503_even_if_unknown(name: str, version: str | None) -> None:
    worker = Worker(Settings(model_dir=MODELS))  # not started: nothing is loaded yet
    with pytest.raises(NotReady) as e:
        worker.plane.model(name, version)
    assert e.value.message == "server is not ready: models are loading"
    assert status_for(e.value, v2=False) == status_for(e.value, v2=True) == 503


# ---- run: admission, the threadpool or the event loop, the timeout ----------------------------------------


def test_run_past_the_in_flight_limit_is_overloaded_at_once_not_queued() -> None:
    worker = started(max_in_flight=2)
    jobs = [Blocked(f"job {i}") for i in range(2)]

    async def scenario() -> list[str]:
        running = [asyncio.ensure_future(through(worker, job)) for job in jobs]
        await until(lambda: all(job.started.is_set() for job in jobs))
        third = Blocked()
        with pytest.raises(Overloaded) as e:
            await through(worker, third)  # answered while both others still run
        assert e.value.message == "2 requests in flight, the limit (NORMSERVE_MAX_IN_FLIGHT)"
        assert not third.started.is_set() and worker.admission.count() == 2
        for job in jobs:
            job.release.set()
        return list(await asyncio.gather(*running))

    assert asyncio.run(scenario()) == ["job 0", "job 1"]
    assert worker.admission.count() == 0
    assert asyncio.run(through(worker, lambda: "admitted again")) == "admitted again"


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
            await through(worker, job, deadline_s=deadline_s)
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
            await through(worker, job)  # waits for the one thread, which the occupant holds
        assert e.value.message == "inference took longer than 0.2 s (NORMSERVE_REQUEST_TIMEOUT_S)"
        assert worker.admission.count() == 0  # the waiter claimed the job: its slot is free now
        occupant.release.set()
        await occupying
        await anyio.to_thread.run_sync(lambda: None)  # the one thread, after whatever was queued before (FIFO)
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
        asyncio.run(through(worker, job))
    assert e.value.message == message
    assert not job.started.is_set() and worker.admission.count() == 0 and in_flight_gauge() == gauge


@pytest.mark.parametrize(("inline", "on_the_loop"), [(True, True), (False, False)], ids=["inline", "threadpool"])
def test_inline_jobs_run_on_the_event_loop_and_the_others_in_the_threadpool(
    ready_worker: Worker, inline: bool, on_the_loop: bool
) -> None:
    job = Blocked()
    job.release.set()

    async def scenario() -> tuple[str, int]:
        return await through(ready_worker, job, inline=inline), threading.get_ident()

    result, loop_thread = asyncio.run(scenario())
    assert result == "done" and (job.thread == loop_thread) == on_the_loop
    assert ready_worker.admission.count() == 0


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "threadpool"])
def test_a_job_that_raises_frees_its_slot_and_its_error_reaches_the_caller(ready_worker: Worker, inline: bool) -> None:
    def job() -> None:
        raise InvalidInput("row 1 has 2 elements, expected 3", "data")

    with pytest.raises(InvalidInput) as e:
        asyncio.run(through(ready_worker, job, inline=inline))
    assert e.value.message == "data: row 1 has 2 elements, expected 3"
    assert ready_worker.admission.count() == 0


def test_a_request_abandoned_by_a_timed_out_drain_is_not_ready_and_its_job_keeps_the_slot() -> None:
    worker = started()
    job = Blocked()

    async def scenario() -> None:
        running = asyncio.ensure_future(through(worker, job))
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
    """What POST /normalize hands the data plane: its body names its model before decoding, so a bad body counts
    as its failure."""
    return worker.plane.infer(codec.NormalizeCodec(worker.settings), body)


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
    model = worker.plane.model("layernorm")  # as V2 names it, before the request is admitted

    def decode(body: bytes) -> tuple[Model, NormalizeInput, None]:
        job()
        raise RuntimeError("released once its request was answered")  # no run: the request counts no execution

    blocking = Stages(decode, model=model, size=INLINE_BODY_BYTES + 1)  # to the threadpool, where the timeout is

    async def scenario() -> None:
        holding = (
            asyncio.ensure_future(through(worker, holder, name="encoder-preln")) if refusal == "overloaded" else None
        )
        await until(lambda: holding is None or holder.started.is_set())
        expected: type[NormserveError] = Overloaded if refusal == "overloaded" else Timeout
        with pytest.raises(expected):
            await worker.plane.infer(blocking, b"")
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
        return worker.plane.model("gpt"), NormalizeInput(np.ones((1, 2))), None

    with pytest.raises(ModelNotFound):
        asyncio.run(worker.plane.infer(Stages(decode), b""))
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


async def admitted(client: httpx.AsyncClient) -> None:
    """Until the worker counts an inference in flight."""
    deadline = time.monotonic() + 30
    while "normserve_inference_requests_in_flight 1.0" not in (await client.get("/metrics")).text:
        assert time.monotonic() < deadline, "no inference was admitted"
        await asyncio.sleep(0.01)


async def overloaded(base: str, path: str, body: dict[str, Any]) -> tuple[httpx.Response, httpx.Response, float, float]:
    slow_body, headers = slow_request()
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        await wait_admitting(client)
        slow = asyncio.ensure_future(client.post(ENC_V2, content=slow_body, headers=headers))
        await admitted(client)  # the slow one is admitted and running
        t0 = time.monotonic()
        refused = await client.post(path, json=body)
        refused_after = time.monotonic() - t0
        first = await slow
        return refused, first, refused_after, time.monotonic() - t0


BUSY = "1 requests in flight, the limit (NORMSERVE_MAX_IN_FLIGHT)"


@pytest.mark.parametrize(
    ("path", "body", "error"),
    [
        ("/normalize", {"data": [1, 2]}, BUSY),
        # OpenAI's routes are admitted before their body names a model: a full worker refuses them alike
        (
            "/v1/embeddings",
            {"model": "encoder", "input": "a"},
            {"message": BUSY, "type": "server_error", "param": None, "code": "overloaded"},
        ),
        (
            "/tokenize",
            {"model": "encoder", "input": "a"},
            {"message": BUSY, "type": "server_error", "param": None, "code": "overloaded"},
        ),
    ],
)
def test_past_max_in_flight_is_503_with_retry_after_at_once(
    one_at_a_time: str, path: str, body: dict[str, Any], error: Any
) -> None:
    refused, first, refused_after, first_after = asyncio.run(overloaded(one_at_a_time, path, body))
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"] == error
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
    worker.lifecycle.start()
    stats = worker.plane.statistics(name, version)["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == reported


def test_a_numpy_backend_request_counts_as_its_models_inference_without_an_execution() -> None:
    """README, Logs: it names the model whose defaults it used, though no session ran."""
    worker = started()
    answer = orjson.loads(asyncio.run(normalize(worker, orjson.dumps({**SEED003.request(), "backend": "numpy"}))))
    np.testing.assert_allclose(answer["output"], SEED003.output, atol=1e-4)
    assert answer["model"] is None and counts(worker) == (1, 0, 1, 0)
