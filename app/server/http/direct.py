"""DirectRoute: FastAPI routes (OpenAPI and all) whose handler calls the endpoint without dependency solving.

FastAPI solves every route's dependencies per request, ~110 us of CPU on a 5.6 KiB /normalize
whose own work is ~160 us (measured in process; docs/benchmarks.md). The routes only ever need
the request, its path parameters and the app's data plane or Worker, so this route class binds those by
parameter name when the route is created and skips the machinery per request. There is no
`Depends` anywhere, so nothing suggests that `app.dependency_overrides` would apply: a test
that wants another worker builds an app with `create_app(settings)`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

# Endpoint parameters a DirectRoute fills, besides path parameters: the request, the app's Worker (the repository's
# routes) and its data plane (inference, metadata, statistics).
_SOURCES: dict[str, Callable[[Request], Any]] = {
    "request": lambda request: request,
    "worker": lambda request: request.app.state.worker,
    "plane": lambda request: request.app.state.worker.plane,
}


def _openapi_view(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """The endpoint as FastAPI's OpenAPI should see it: without the parameters this route fills itself."""

    @functools.wraps(endpoint)
    async def view(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("DirectRoute calls the endpoint itself")  # pragma: no cover

    sig = inspect.signature(endpoint)
    public = [p for name, p in sig.parameters.items() if name not in _SOURCES or name == "request"]
    view.__signature__ = sig.replace(parameters=public)  # type: ignore[attr-defined]
    return view


Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])
_HOT = "normserve_hot"  # the mark `hot` leaves on an endpoint, read when its DirectRoute is created


def hot(endpoint: Endpoint) -> Endpoint:
    """Marks an endpoint, under its route's decorator, for app/server/http/hotpath.py: answered outside the router."""
    endpoint.__dict__[_HOT] = True
    return endpoint


def _path_param(name: str) -> Callable[[Request], Any]:
    return lambda request: request.path_params[name]


class DirectRoute(APIRoute):
    """An APIRoute for `async def` endpoints whose parameters are path parameters, `request` or `worker`."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        self.direct_endpoint = endpoint
        self.hot: bool = endpoint.__dict__.get(_HOT, False)
        super().__init__(path, _openapi_view(endpoint), **kwargs)
        # The request -> response function alone, for app/server/http/hotpath.py, which calls it outside any router.
        self.direct_handler = self.get_route_handler()

    # HEAD is answered as GET, as Starlette's own routes do (probes and load balancers send HEAD /v2/health/live):
    # the route matches and runs it as a GET, and uvicorn, whose scope still says HEAD, sends the head without the
    # body. Not in `methods`, which OpenAPI lists: one operation id for two methods is a duplicate there.
    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        return super().matches(self._as_get(scope))

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().handle(self._as_get(scope), receive, send)

    def _as_get(self, scope: Scope) -> Scope:
        if scope["type"] == "http" and scope["method"] == "HEAD" and "GET" in (self.methods or ()):
            return {**scope, "method": "GET"}
        return scope

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint = self.direct_endpoint
        if not inspect.iscoroutinefunction(endpoint):
            raise TypeError(f"DirectRoute {self.path}: {endpoint.__name__} must be async def")
        path_params = set(self.param_convertors)
        sources: dict[str, Callable[[Request], Any]] = {}
        for name in inspect.signature(endpoint).parameters:
            if name in path_params:
                sources[name] = _path_param(name)
            elif name in _SOURCES:
                sources[name] = _SOURCES[name]
            else:  # a query or body parameter would need FastAPI's solving: refuse at start-up, not per request
                raise TypeError(f"DirectRoute {self.path}: cannot fill parameter {name!r} of {endpoint.__name__}")

        async def handler(request: Request) -> Response:
            response: Response = await endpoint(**{name: get(request) for name, get in sources.items()})
            return response

        return handler
