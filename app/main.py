"""The ASGI app: `create_app(settings)` is the one constructor; `app` serves `uvicorn app.main:app`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI

from app import __version__
from app.core import dataplane
from app.core.runtime import ModelLoadError, Runtime
from app.server import logs, metrics
from app.server.admission import Admission
from app.server.api import errors as handlers
from app.server.api import health, playground
from app.server.api import metrics as metrics_api
from app.server.api.rest import routes as rest
from app.server.api.v2 import routes as v2
from app.server.drain import Drain
from app.server.observability import ObservabilityMiddleware
from app.server.statistics import Stats
from app.server.worker import State
from app.settings import Settings

log = logging.getLogger("normserve")


def load_models(state: State) -> None:
    """sha256 checks, sessions, parity warm-up; only then ready. Runs in a thread so liveness answers meanwhile."""
    adm = state.admission
    try:
        state.runtime.load()
        adm.not_ready_reason = "parity warm-up running"
        figures = dataplane.warm_up(state.runtime)
    except (ModelLoadError, OSError, ValueError, KeyError) as e:
        adm.not_ready_reason = f"model check failed: {e}"
        log.error("not ready: %s", e, extra={"reason": adm.not_ready_reason})
        return
    for name, model in state.runtime.models.items():
        metrics.record_model(name, model.load_seconds, figures.get(name))
    log.info(
        "ready: parity warm-up max abs diff %s",
        {k: f"{v:.2e}" for k, v in figures.items()},
        extra={"parity_max_abs_diff": figures},
    )
    adm.ready = True


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: State = app.state.normserve
    logs.configure(state.settings.log_level)
    metrics.reap_dead_workers()
    # The threadpool runs every inference; it must admit as many as the in-flight limit does.
    anyio.to_thread.current_default_thread_limiter().total_tokens = max(40, state.settings.max_in_flight)
    loading = asyncio.create_task(asyncio.to_thread(load_models, state))
    drain = Drain(state.admission, state.settings.drain_timeout_s)
    drain.install()  # SIGTERM: not ready at once, in-flight requests finish, then uvicorn's shutdown
    yield
    drain.uninstall()
    state.admission.draining = True
    await loading
    metrics.worker_exit()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(
        title="normserve",
        version=__version__,
        summary="Layer normalization and a Transformer encoder, served over HTTP and the Open Inference Protocol.",
        lifespan=lifespan,
    )
    app.state.normserve = state = State(settings, Runtime(settings), Admission(settings.max_in_flight))
    state.runtime.in_flight = lambda: state.admission.in_flight  # dynamic batching's "nobody else is coming"
    app.state.stats = Stats()  # Triton statistics of the V2 infer route
    handlers.install(app)
    app.add_middleware(ObservabilityMiddleware)  # pure ASGI: request ids, request metrics, the JSON log line
    app.include_router(rest.router)
    app.include_router(health.router)
    app.include_router(v2.router)
    app.include_router(metrics_api.router)
    playground.install(app)  # GET / and /static
    return app


app = create_app()
