"""The inference routes straight from the app's ASGI entry: POST /normalize, /encode and the V2 infer routes.

FastAPI 0.165 walks every included router, its telemetry hooks and an AsyncExitStack before a route runs:
with Starlette's middleware stack that was ~0.1 ms of CPU per small request, about as much as the
computation itself (cProfile of /normalize (1,8,64), scripts/server_cpu.py). These four routes need none
of it: `NormserveApp` matches them by hand and runs them through the same pure-ASGI pieces the stack
has, in the same order, so every answer is the one the stack gives (tests/server/test_hotpath.py
compares them): Starlette's ServerErrorMiddleware (an unexpected error: 500 with the request id, then
re-raised for uvicorn's log) -> CloseUnreadBodies -> ObservabilityMiddleware -> BudgetMiddleware -> the error table
(NormserveError -> errors.error_response) -> the route's DirectRoute handler. Every other request,
and every request of an app whose middleware was changed after create_app, goes through FastAPI.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette._utils import get_route_path
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from app.errors import NormserveError
from app.server.api import errors
from app.server.api.direct import DirectRoute
from app.server.budget import BudgetMiddleware
from app.server.connections import CloseUnreadBodies
from app.server.telemetry.observability import ObservabilityMiddleware

# What create_app adds (app.user_middleware lists the outermost first): the hot path stands for exactly this.
MIDDLEWARE = (CloseUnreadBodies, ObservabilityMiddleware, BudgetMiddleware)
_V2 = "/v2/models/"
_INFER = "/infer"


class HotRoutes:
    """The four routes' DirectRoutes, matched without regexes; `serve` runs one through the middleware's chain."""

    def __init__(self, routes: list[DirectRoute]) -> None:
        by_path = {route.path: route for route in routes if "POST" in (route.methods or ())}
        self.exact = {path: by_path[path] for path in ("/normalize", "/encode")}
        self.infer = by_path["/v2/models/{name}/infer"]
        self.infer_version = by_path["/v2/models/{name}/versions/{version}/infer"]
        self.chain = CloseUnreadBodies(ObservabilityMiddleware(BudgetMiddleware(self._answer)))

    def match(self, path: str) -> tuple[DirectRoute, dict[str, str]] | None:
        """The route and path parameters of a POST path, as Starlette's `{name}` ([^/]+) would match them."""
        route = self.exact.get(path)
        if route is not None:
            return route, {}
        if not (path.startswith(_V2) and path.endswith(_INFER)):
            return None
        parts = path[len(_V2) : -len(_INFER)].split("/")
        if len(parts) == 1 and parts[0]:
            return self.infer, {"name": parts[0]}
        if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
            return self.infer_version, {"name": parts[0], "version": parts[2]}
        return None

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ServerErrorMiddleware's part: an error past every handler is a 500 (if nothing was sent), re-raised."""
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.chain(scope, receive, sending)
        except Exception as exc:
            response = await errors.unexpected(Request(scope), exc)
            if not started:
                await response(scope, receive, send)
            raise

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The route's answer, or the error table's (ExceptionMiddleware's part)."""
        request = Request(scope, receive)
        try:
            response = await scope["route"].direct_handler(request)
        except NormserveError as exc:
            response = errors.error_response(request, exc)
        await response(scope, receive, send)


class NormserveApp(FastAPI):
    """FastAPI, with the inference routes answered by HotRoutes (see the module's docstring)."""

    hot: HotRoutes | None = None  # set by enable_hot_routes, once every route is included
    _hot_checked = False

    def enable_hot_routes(self, routes: list[DirectRoute]) -> None:
        self.hot = HotRoutes(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = self.hot
        if hot is not None and scope["type"] == "http" and scope["method"] == "POST" and not self.root_path:
            if not self._hot_checked:
                self._check_middleware()
                hot = self.hot
            matched = None if hot is None else hot.match(get_route_path(scope))
            if matched is not None and hot is not None:
                scope["app"], scope["route"], scope["path_params"] = self, matched[0], matched[1]
                await hot.serve(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def _check_middleware(self) -> None:
        """A test or an embedder that adds middleware after create_app gets FastAPI's path for every request."""
        self._hot_checked = True
        if tuple[object, ...](m.cls for m in self.user_middleware) != MIDDLEWARE:
            self.hot = None
