"""The ASGI app: `create_app(settings)` builds one Worker and mounts every protocol's routes on it."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio.to_thread
from fastapi import FastAPI

from app import __version__
from app.core import heap
from app.server import group, modelsync
from app.server.api import docs, health, openapi, playground
from app.server.api import metrics as metrics_api
from app.server.api.openai import routes as openai_api
from app.server.api.rest import routes as rest
from app.server.api.v2.grpc import server as grpc_server
from app.server.api.v2.http import repository, tracelog
from app.server.api.v2.http import routes as v2
from app.server.http import errors, heads
from app.server.http.budget import BudgetMiddleware
from app.server.http.connections import CloseUnreadBodies
from app.server.http.hotpath import NormserveApp
from app.server.telemetry import logs, metrics, tracing
from app.server.telemetry.observability import ObservabilityMiddleware
from app.server.worker import Worker
from app.settings import Settings

log = logging.getLogger("normserve.models")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    worker: Worker = app.state.worker
    lifecycle = worker.lifecycle
    logs.configure(worker.settings.log_level)
    heap.raise_thresholds()  # in each worker process: a request's arrays reused, not faulted in anew
    metrics.reap_dead_workers()
    tracing.STATE.configure(os.environ)  # OTLP export from OTEL_* in each worker process, after the fork
    # The threadpool runs every inference; it must admit as many as the in-flight limit does.
    anyio.to_thread.current_default_thread_limiter().total_tokens = max(40, worker.settings.max_in_flight)
    folder = None
    if group.one_of_several():
        try:
            group.reap_shared_dirs()
            folder = group.shared_dir()
        except group.UnsafeFolder as e:
            log.error("%s", e)  # the one line to read among uvicorn's traceback; the server does not start
            raise
    sync = lifecycle.share(folder) if worker.settings.model_control == "explicit" and folder is not None else None
    starting = asyncio.create_task(asyncio.to_thread(lifecycle.start))  # liveness answers meanwhile
    if folder is not None:
        await replacement_started(folder, starting)
    polling = asyncio.create_task(poll(worker, starting)) if worker.settings.model_control == "poll" else None
    watching = asyncio.create_task(modelsync.watch(sync, starting, lifecycle.settle)) if sync else None  # peers' loads
    worker.drain.install()  # SIGTERM: not ready at once, in-flight requests finish, then uvicorn's shutdown
    heads.configure(worker.settings)  # head deadline and size, connection limit (app/server/http/heads.py)
    config = worker.drain.server_config()
    if config is not None:  # a bare `uvicorn app.main:app`: its protocol guarded here (normserve serve names it)
        heads.install(config, worker.settings)
    async with grpc_server.serving(worker):  # gRPC on NORMSERVE_GRPC_PORT in this worker, stopped with a grace
        yield
    worker.drain.uninstall()
    worker.admission.draining = True
    for task in (polling, watching):
        if task is not None:
            task.cancel()
    lifecycle.leave()
    await starting
    tracing.STATE.shutdown()  # flushes the spans still queued
    metrics.worker_exit()


STARTED = "started"  # in the workers' shared folder, once one of them has loaded its start-up models


async def replacement_started(folder: Path, starting: asyncio.Task[None]) -> None:
    """A worker that starts once another has served (uvicorn replaced one that died) returns only when its models
    are loaded: uvicorn takes connections once the lifespan has started, and until then the others serve them. It
    took some and answered 503 "parity warm-up running" while the server was ready. At the server's own start,
    liveness answers meanwhile."""
    marker = folder / STARTED
    if marker.exists():
        await asyncio.shield(starting)
    else:
        starting.add_done_callback(lambda _: marker.touch())


async def poll(worker: Worker, starting: asyncio.Task[None]) -> None:
    """poll mode: after start-up, rescan the repository every NORMSERVE_POLL_INTERVAL_S, in the threadpool."""
    await starting
    while True:
        await asyncio.sleep(worker.settings.poll_interval_s)
        try:
            await asyncio.to_thread(worker.lifecycle.poll)
        except Exception:  # a folder half written or gone: the next scan sees it again, the loop must go on
            log.exception("poll: scanning %s failed", worker.settings.model_dir)


def create_app(settings: Settings | None = None) -> FastAPI:
    app = NormserveApp(
        title="normserve",
        version=__version__,
        summary="Layer normalization and a Transformer encoder, served over HTTP and the Open Inference Protocol.",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's page loads from a CDN; app/server/api/docs.py serves it offline
        redoc_url=None,  # ReDoc's bundle always loads its logo from a CDN
    )
    app.state.worker = Worker(settings or Settings())
    errors.install(app)
    app.add_middleware(BudgetMiddleware)  # request bodies counted in NORMSERVE_MAX_INFLIGHT_BYTES as they are read
    app.add_middleware(ObservabilityMiddleware)  # pure ASGI: request ids, request metrics, the JSON log line
    app.add_middleware(CloseUnreadBodies)  # an answer sent before its request's body ended closes the connection
    for router in (
        rest.router,
        health.router,
        v2.router,
        repository.router,
        tracelog.router,
        metrics_api.router,
        openai_api.router,
    ):
        app.include_router(router)
    playground.install(app)  # GET / and /static
    docs.install(app)  # GET /docs and /docs/assets
    openapi.install(app)  # the protocol's schemas in /openapi.json
    return app
