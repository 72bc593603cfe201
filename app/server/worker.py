"""What routes share: the app's state through Depends, and running blocking work off the event loop."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar

import anyio
from fastapi import Depends
from starlette.requests import Request

from app.core.runtime import Runtime
from app.errors import NotReady, Timeout
from app.server import metrics
from app.server.admission import Admission
from app.settings import Settings

T = TypeVar("T")
# Bodies up to this size are computed on the event loop: (1,8,64) in JSON is 5.6 KiB and takes ~0.15 ms.
INLINE_BODY_BYTES = 16 * 1024


@dataclass
class State:
    """Everything a worker builds once in its lifespan."""

    settings: Settings
    runtime: Runtime
    admission: Admission


async def get_state(request: Request) -> State:
    # async: FastAPI runs a plain `def` dependency in the threadpool, a thread hop per request (measured).
    state: State = request.app.state.normserve
    return state


StateDep = Annotated[State, Depends(get_state)]


async def run_inference(state: State, fn: Callable[[], T], inline: bool = False) -> T:
    """Admit the request, run fn in the threadpool, and answer 504 past the timeout without killing the worker.

    inline=True runs fn on the event loop: only for tiny requests (INLINE_BODY_BYTES), whose work takes
    less than the thread hop and the GIL hand-offs it brings (measured in docs/benchmarks.md).
    """
    state.admission.enter()
    metrics.IN_FLIGHT.inc()

    # Whoever takes `claim` first releases the slot: the job when it starts (so a timed-out job still
    # counts until it really ends), or the waiter when it gave up before any thread picked the job up.
    claim = threading.Lock()

    def release() -> None:
        state.admission.leave()
        metrics.IN_FLIGHT.dec()

    def job() -> T:
        if not claim.acquire(blocking=False):
            raise RuntimeError("inference abandoned before it started")  # its waiter has already answered
        try:
            return fn()
        finally:
            release()

    if inline:
        return job()
    abandon = anyio.CancelScope()  # cancelled by a drain that timed out (app/lifecycle.py)
    state.admission.abandonable.add(abandon)
    try:
        with anyio.fail_after(state.settings.request_timeout_s), abandon:
            return await anyio.to_thread.run_sync(job, abandon_on_cancel=True)
    except TimeoutError:
        raise Timeout(
            f"inference took longer than {state.settings.request_timeout_s} s (NORMSERVE_REQUEST_TIMEOUT_S)"
        ) from None
    finally:
        state.admission.abandonable.discard(abandon)
        if claim.acquire(blocking=False):
            release()
    raise NotReady("server is shutting down and its drain timeout (NORMSERVE_DRAIN_TIMEOUT_S) passed; retry elsewhere")
