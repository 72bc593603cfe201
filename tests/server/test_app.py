"""app/server/app.py: create_app puts one Worker on app.state, mounts every protocol's routes, and its lifespan
starts the worker (ready once verified), wraps the server's signal handlers, and drains on the way out.

The lifespan runs here in process, on the main thread as under uvicorn, with the app driven by httpx over ASGI;
uvicorn's own handle_exit is installed first, as uvicorn installs it before the lifespan starts. gRPC is off
(NORMSERVE_GRPC_PORT=0) in these apps, as in every test server that does not test gRPC (tests/live_server.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import TypeVar

import anyio.to_thread
import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI
from starlette.routing import Match

from app.core.seeds import SEED003
from app.server import group
from app.server.app import create_app
from app.server.drain import DRAIN_SIGNALS
from app.server.worker import Worker
from app.settings import Settings
from benchmarks.servers import Server
from tests.cli.normserve import NORMSERVE
from tests.live_server import MODELS, cli_server
from tests.polling import run
from tests.repositories import copy_models
from tests.server.test_modelsync import all_started, explicit_env, workers

T = TypeVar("T")

# Every documented route of every protocol: REST, health, V2 and metrics.
ROUTES = [
    ("POST", "/normalize"),
    ("POST", "/encode"),
    ("GET", "/v2/health/live"),
    ("GET", "/v2/health/ready"),
    ("GET", "/v2"),
    ("GET", "/v2/models/stats"),
    ("GET", "/v2/models/{name}"),
    ("GET", "/v2/models/{name}/versions/{version}"),
    ("GET", "/v2/models/{name}/ready"),
    ("GET", "/v2/models/{name}/versions/{version}/ready"),
    ("POST", "/v2/models/{name}/infer"),
    ("POST", "/v2/models/{name}/versions/{version}/infer"),
    ("GET", "/v2/models/{name}/stats"),
    ("GET", "/v2/models/{name}/versions/{version}/stats"),
    ("GET", "/v2/models/{name}/config"),
    ("GET", "/v2/models/{name}/versions/{version}/config"),
    ("GET", "/v2/models/{name}/monitor"),
    ("GET", "/v2/models/{name}/versions/{version}/monitor"),
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/{name}/load"),
    ("POST", "/v2/repository/models/{name}/unload"),
    ("GET", "/metrics"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/models"),
    ("POST", "/tokenize"),
]


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://normserve")


async def ready_answer(c: httpx.AsyncClient, settled: str) -> httpx.Response:
    """GET /v2/health/ready until its body holds `settled` (the worker starts in the background)."""
    deadline = time.monotonic() + 30
    while settled not in (r := await c.get("/v2/health/ready")).text:
        assert time.monotonic() < deadline, r.text
        await asyncio.sleep(0.01)
    return r


# ---- create_app --------------------------------------------------------------------------------------------


def test_create_app_puts_one_worker_built_from_the_given_settings_on_app_state(tmp_path: Path) -> None:
    settings = Settings(model_dir=tmp_path, max_in_flight=3, drain_timeout_s=7.0)
    app = create_app(settings)
    worker = app.state.worker
    assert isinstance(worker, Worker) and worker.settings is settings
    assert (worker.admission.max_in_flight, worker.drain.timeout_s) == (3, 7.0)
    assert worker.drain.admission is worker.admission  # one admission: what drains is what admits
    assert create_app(settings).state.worker is not worker  # each app its own worker


def test_create_app_without_settings_reads_them_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NORMSERVE_MODEL_DIR", str(tmp_path))
    monkeypatch.setenv("NORMSERVE_MAX_IN_FLIGHT", "5")
    settings = create_app().state.worker.settings
    assert (settings.model_dir, settings.max_in_flight) == (tmp_path, 5)


def test_the_routes_answer_from_the_apps_own_worker() -> None:
    app = create_app(Settings(model_dir=MODELS))

    async def readiness() -> httpx.Response:
        async with client(app) as c:
            return await c.get("/v2/health/ready")

    before = run(readiness())  # no lifespan has run: the worker has not started
    assert before.status_code == 503 and before.json() == {"ready": False, "error": "not ready: models are loading"}
    app.state.worker.lifecycle.start()
    after = run(readiness())
    assert after.status_code == 200 and after.json() == {"ready": True}


def route_match(app: FastAPI, method: str, path: str) -> Match:
    """How the app's router matches a request: FULL (a route), PARTIAL (the path, another method) or NONE."""
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    return max((route.matches(scope)[0] for route in app.router.routes), key=lambda m: m.value)


def test_every_protocols_routes_are_mounted_and_no_others_documented() -> None:
    paths = create_app(Settings(model_dir=MODELS)).openapi()["paths"]
    assert sorted((method.upper(), path) for path, ops in paths.items() for method in ops) == sorted(ROUTES)


@pytest.mark.parametrize(("method", "template"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_each_route_takes_its_method_and_only_that(method: str, template: str) -> None:
    app = create_app(Settings(model_dir=MODELS))
    path = template.replace("{name}", "layernorm").replace("{version}", "1")
    assert route_match(app, method, path) == Match.FULL
    assert route_match(app, "DELETE", path) == Match.PARTIAL  # the path is known: 405, not 404


@pytest.mark.parametrize(
    "path",
    ["/", "/static/app.js", "/static/style.css", "/docs", "/docs/assets/swagger-ui.css", "/openapi.json", "/v2/"],
)
def test_the_undocumented_routes_are_mounted_the_playground_the_docs_and_v2_with_a_slash(path: str) -> None:
    assert route_match(create_app(Settings(model_dir=MODELS)), "GET", path) == Match.FULL


def test_an_unknown_path_matches_no_route() -> None:
    assert route_match(create_app(Settings(model_dir=MODELS)), "GET", "/v3/models") == Match.NONE


# ---- the lifespan ------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("restore_logging")
def test_the_lifespan_starts_the_worker_until_ready_and_drains_it_on_shutdown(
    uvicorn_server: uvicorn.Server,
) -> None:
    app = create_app(Settings(model_dir=MODELS, grpc_port=0))  # gRPC off: no port of its own in these tests
    worker: Worker = app.state.worker

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with app.router.lifespan_context(app), client(app) as c:
            assert (await c.get("/v2/health/live")).json() == {"live": True}  # at once, whatever the models do
            ready = await ready_answer(c, '"ready":true')
            # The server's handlers are wrapped while the app runs: SIGTERM would drain first.
            assert all(getattr(signal.getsignal(sig), "__self__", None) is worker.drain for sig in DRAIN_SIGNALS)
            answer = await c.post("/normalize", json={"data": SEED003.x})
        return ready, answer

    ready, answer = run(scenario())
    assert ready.status_code == 200 and ready.json() == {"ready": True}
    assert answer.status_code == 200
    np.testing.assert_allclose(answer.json()["output"], SEED003.output, atol=1e-4)
    assert worker.admission.ready and worker.admission.draining  # shut down: refusing new work
    assert all(signal.getsignal(sig) == uvicorn_server.handle_exit for sig in DRAIN_SIGNALS)


def unusable_repository(tmp_path: Path, how: str) -> tuple[Path, str]:
    """A model_dir the worker cannot load anything from, and the whole not-ready error it gives."""
    if how == "missing":
        root = tmp_path / "models"
        return root, f"not ready: model check failed: {root}: model repository missing; run `normserve export`"
    (tmp_path / "manifest.json").write_text('{"models": {}}')  # normserve 0.1's single manifest
    return tmp_path, (
        f"not ready: model check failed: {tmp_path}/manifest.json: the single-manifest layout of normserve 0.1; "
        "move it into the repository layout (<name>/<version>/) with "
        f"`normserve models migrate --repository {tmp_path}`"
    )


@pytest.mark.usefixtures("restore_logging", "signal_handlers")
@pytest.mark.parametrize("how", ["missing", "legacy-layout"])
def test_the_lifespan_with_no_models_keeps_the_app_live_and_says_why_it_is_not_ready(tmp_path: Path, how: str) -> None:
    model_dir, error = unusable_repository(tmp_path, how)
    app = create_app(Settings(model_dir=model_dir, grpc_port=0))

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with app.router.lifespan_context(app), client(app) as c:
            not_ready = await ready_answer(c, "model check failed")
            return await c.get("/v2/health/live"), not_ready

    live, not_ready = run(scenario())
    assert live.status_code == 200 and live.json() == {"live": True}
    assert not_ready.status_code == 503 and not_ready.headers["retry-after"] == "1"
    assert not_ready.json() == {"ready": False, "error": error}


@pytest.mark.usefixtures("restore_logging", "signal_handlers")
@pytest.mark.parametrize(("max_in_flight", "threads"), [(4, 40), (40, 40), (100, 100)])
def test_the_lifespan_gives_the_threadpool_at_least_as_many_threads_as_admitted_inferences(
    max_in_flight: int, threads: int
) -> None:
    app = create_app(Settings(model_dir=MODELS, max_in_flight=max_in_flight, grpc_port=0))

    async def scenario() -> int:
        async with app.router.lifespan_context(app):
            return int(anyio.to_thread.current_default_thread_limiter().total_tokens)

    assert run(scenario()) == threads


@pytest.mark.slow  # about 30 s: three models to load twice, on two cores
def test_a_worker_that_replaces_a_dead_one_takes_connections_only_once_its_models_are_loaded(tmp_path: Path) -> None:
    """It took some while its start-up load ran and answered 503 "parity warm-up running", the server being ready.
    The encoders make that load last seconds; probes on new connections, which either worker may take, run until
    the replacement has started."""
    repository = copy_models(tmp_path / "models")
    env = explicit_env(repository)
    with cli_server([str(NORMSERVE), "serve", "--workers", "2"], env) as server:
        all_started(server, 2)
        first = workers(server, 2)
        os.kill(min(first), signal.SIGKILL)
        answers: Counter[tuple[int, str]] = Counter()
        deadline = time.monotonic() + 60
        while len(first & (now := workers(server, 2))) != 1 or len(now) != 2 or not _started(server, now):
            assert time.monotonic() < deadline, "uvicorn did not replace the worker"
            r = httpx.get(f"{server.base}/v2/health/ready")
            answers[r.status_code, r.text] += 1
        assert {status for status, _ in answers} == {200}, answers


def _started(server: Server, pids: set[int]) -> bool:
    """Whether each of these workers has loaded its start-up models (modelsync.py's acknowledgements)."""
    folder = group.runtime_dir() / f"server-{server.pid}-{group.started_at(server.pid)}"
    acks = [folder / f"worker-{pid}.json" for pid in pids]
    return all(f.exists() and json.loads(f.read_text())["generation"] >= 0 for f in acks)
