"""The hot routes straight from the app's ASGI entry: POST /normalize, /encode and the V2 infer routes.

FastAPI 0.165 walks every included router, its telemetry hooks and an AsyncExitStack before a route runs:
with Starlette's middleware stack that was ~0.1 ms of CPU per small request, about as much as the
computation itself (cProfile of /normalize (1,8,64), scripts/server_cpu.py). The routes marked `@hot`
(app/server/http/direct.py) need none of it: `NormserveApp` matches them without regexes and runs them
through a chain built as Starlette's `build_middleware_stack` builds its stack, from the same lists and
at the same moment: ServerErrorMiddleware (the app's 500 handler) -> each of `app.user_middleware`,
outermost first -> ExceptionMiddleware (the app's error table) -> the route's DirectRoute handler. So
every answer is the one the stack gives (tests/server/http/test_hotpath.py compares them), middleware added
before the app starts runs on the hot routes too, and adding one after is Starlette's RuntimeError.
FastAPI's own layers are left out: its telemetry (off unless an OpenTelemetry provider is set globally),
its exit stack (for uploaded files, which no hot route takes) and its body limit (refused if set).
A hot route answers every path its template matches: no route declared before it may match them.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.convertors import StringConvertor
from starlette.middleware import Middleware
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp, ExceptionHandler, Receive, Scope, Send

from app.server.http.direct import DirectRoute


class Template:
    """A hot route's path as segments: literals, and `{name}` parameters that match one non-empty segment.

    That is what Starlette's `{name}` (the str convertor, `[^/]+`) matches when it is a whole segment;
    any other parameter would need the route's regex, and is refused when the app starts."""

    def __init__(self, route: DirectRoute) -> None:
        parts = route.path.split("/")
        self.route, self.size = route, len(parts)
        self.literals: list[tuple[int, str]] = []
        self.params: list[tuple[int, str]] = []
        for i, part in enumerate(parts):
            name = part[1:-1]
            if "{" not in part:
                self.literals.append((i, part))
            elif part == f"{{{name}}}" and isinstance(route.param_convertors.get(name), StringConvertor):
                self.params.append((i, name))
            else:
                raise TypeError(f"hot route {route.path}: only whole-segment {{name}} parameters are matched")

    def match(self, parts: list[str]) -> dict[str, str] | None:
        if any(parts[i] != literal for i, literal in self.literals):
            return None
        params = {name: parts[i] for i, name in self.params}
        return params if all(params.values()) else None


class HotRoutes:
    """The app's hot routes by method, and the middleware chain that answers them."""

    def __init__(self, app: FastAPI, routes: list[DirectRoute]) -> None:
        self.exact: dict[tuple[str, str], DirectRoute] = {}
        self.templates: dict[str, list[Template]] = {}
        for route in routes:
            for method in route.methods or ():
                if "{" in route.path:
                    self.templates.setdefault(method, []).append(Template(route))
                else:  # the first route declared wins, as in Starlette's router
                    self.exact.setdefault((method, route.path), route)
        self.chain = chain(app, _answer)

    def match(self, method: str, path: str) -> tuple[DirectRoute, dict[str, str]] | None:
        """The route and path parameters a request's method and route path select, as Starlette's router would."""
        route = self.exact.get((method, path))
        if route is not None:
            return route, {}
        templates = self.templates.get(method)
        if templates:
            parts = path.split("/")
            for template in templates:
                params = template.match(parts) if template.size == len(parts) else None
                if params is not None:
                    return template.route, params
        return None


def chain(app: FastAPI, inner: ASGIApp) -> ASGIApp:
    """`inner` wrapped as `Starlette.build_middleware_stack` wraps the router (FastAPI's own layers aside)."""
    error_handler: ExceptionHandler | None = None
    handlers: dict[Any, ExceptionHandler] = {}
    for key, value in app.exception_handlers.items():
        if key in (500, Exception):
            error_handler = value
        else:
            handlers[key] = value
    middleware = [
        Middleware(ServerErrorMiddleware, handler=error_handler, debug=app.debug),
        *app.user_middleware,
        Middleware(ExceptionMiddleware, handlers=handlers, debug=app.debug),
    ]
    for cls, args, kwargs in reversed(middleware):
        inner = cls(inner, *args, **kwargs)
    return inner


async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
    """The matched route's answer (its errors go to the ExceptionMiddleware around it)."""
    response = await scope["route"].direct_handler(Request(scope, receive))
    await response(scope, receive, send)


def route_path(scope: Scope) -> str:
    """The path the routes see: `path` less a `root_path` it starts with (ASGI: `path` includes `root_path`)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("/", ""):
        return path[len(root) :]
    return path


class NormserveApp(FastAPI):
    """FastAPI, with the routes marked `@hot` answered by HotRoutes (see the module's docstring)."""

    hot: HotRoutes | None = None  # built with the middleware stack, when the app starts

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hot_routes: list[DirectRoute] = []

    def include_router(self, router: APIRouter, **options: Any) -> None:
        """FastAPI's; the router's hot routes are kept for HotRoutes, which answers them at their declared paths."""
        hot = [route for route in router.routes if isinstance(route, DirectRoute) and route.hot]
        if hot and options:
            raise TypeError(f"hot route {hot[0].path}: include its router without options, or it is not hot")
        super().include_router(router, **options)
        self.hot_routes += hot

    def build_middleware_stack(self) -> ASGIApp:
        """Starlette's stack, and the hot routes' chain from the same middleware list (built once, at start)."""
        if self.max_body_size is not None:  # FastAPI's own limit, in its stack: the hot routes would skip it
            raise RuntimeError("NormserveApp: max_body_size is not applied on the hot routes; NORMSERVE_ limits are")
        self.hot = HotRoutes(self, self.hot_routes)
        return super().build_middleware_stack()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        hot = self.hot
        if hot is not None and scope["type"] == "http":
            if self.root_path:  # as FastAPI's __call__ does
                scope["root_path"] = self.root_path
            matched = hot.match(scope["method"], route_path(scope))
            if matched is not None:
                scope["app"], scope["route"], scope["path_params"] = self, matched[0], matched[1]
                await hot.chain(scope, receive, send)
                return
        await super().__call__(scope, receive, send)
