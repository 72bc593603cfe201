"""DirectRoute: FastAPI routes (OpenAPI and all) whose handler calls the endpoint without dependency solving.

FastAPI solves every route's dependencies per request, ~110 us of CPU on a 5.6 KiB /normalize
whose own work is ~160 us (measured in process; docs/benchmarks.md). The hot routes only ever
need the request, its path parameters and what the app built once, so this route class binds
those by parameter name when the route is created and skips the machinery per request.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

# Endpoint parameters a DirectRoute fills, besides path parameters: the request and the app's own objects.
_SOURCES: dict[str, Callable[[Request], Any]] = {
    "request": lambda request: request,
    "state": lambda request: request.app.state.normserve,
    "stats": lambda request: request.app.state.stats,
}


def _path_param(name: str) -> Callable[[Request], Any]:
    return lambda request: request.path_params[name]


class DirectRoute(APIRoute):
    """An APIRoute for `async def` endpoints whose parameters are path parameters, request, state or stats."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint = self.endpoint
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
