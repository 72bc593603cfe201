"""What routes share: the app's state through Depends, and running blocking work off the event loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar

import anyio
from fastapi import Depends
from starlette.requests import Request

from app.admission import Admission
from app.errors import Timeout
from app.runtime import Runtime
from app.settings import Settings

T = TypeVar("T")


@dataclass
class State:
    """Everything a worker builds once in its lifespan."""

    settings: Settings
    runtime: Runtime
    admission: Admission


def get_state(request: Request) -> State:
    state: State = request.app.state.normserve
    return state


StateDep = Annotated[State, Depends(get_state)]


async def run_inference(state: State, fn: Callable[[], T]) -> T:
    """Admit the request, run fn in the threadpool, and answer 504 past the timeout without killing the worker."""
    state.admission.enter()

    def job() -> T:
        try:
            return fn()
        finally:
            # Released by the thread itself: an abandoned (timed out) job still counts until it really ends.
            state.admission.leave()

    try:
        with anyio.fail_after(state.settings.request_timeout_s):
            return await anyio.to_thread.run_sync(job, abandon_on_cancel=True)
    except TimeoutError:
        raise Timeout(
            f"inference took longer than {state.settings.request_timeout_s} s (NORMSERVE_REQUEST_TIMEOUT_S)"
        ) from None
