"""app/server/http/hotpath.py: the inference routes answered outside FastAPI's stack give the answers the stack gives.

One app, its worker started in process; each request goes once through the hot path and once through FastAPI
(the app's FastAPI entry), and the two answers (status, headers, body), access lines and metrics must match.
Where a test must know the hot path answered, FastAPI's stack is swapped for one that fails the test.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import orjson
import pytest
from fastapi import APIRouter, FastAPI
from prometheus_client import REGISTRY
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.server.app import create_app
from app.server.http.direct import DirectRoute, hot
from app.server.http.hotpath import NormserveApp
from app.settings import Settings
from tests.live_server import MODELS
from tests.server.log_records import captured

JSON = {"content-type": "application/json"}
V2 = orjson.dumps({"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 4]}]})
# (method, path, headers, body): answers, errors from the one error table, and paths only FastAPI matches.
CASES = [
    ("POST", "/normalize", JSON, b'{"data": [[1.0, 2.0, 4.0]], "normalized_shape": [3]}'),
    ("POST", "/normalize", {"content-type": "text/plain"}, b"{}"),  # 415 before the body is read: closes
    ("POST", "/normalize", JSON, b'{"data": [[1.0, 2.0'),
    ("POST", "/normalize", {**JSON, "content-encoding": "br"}, b"{}"),
    ("POST", "/encode", JSON, b'{"data": [[0.5]]}'),
    ("POST", "/v2/models/layernorm/infer", JSON, V2),
    ("POST", "/v2/models/layernorm/versions/1/infer", JSON, V2),
    ("POST", "/v2/models/layernorm/versions/7/infer", JSON, V2),
    ("POST", "/v2/models/nope/infer", JSON, V2),
    ("POST", "/v2/models/layernorm/infer", JSON, b"[]"),
    ("POST", "/v2/models//infer", JSON, V2),
    ("POST", "/v2/models/a/b/infer", JSON, V2),
    ("POST", "/normalize/", JSON, b"{}"),
    ("GET", "/normalize", {}, b""),
]


@pytest.fixture(scope="module")
def app() -> NormserveApp:
    app = create_app(Settings(model_dir=MODELS, grpc_port=0, batch_max_size=1))
    assert isinstance(app, NormserveApp)
    app.state.worker.lifecycle.start()
    assert app.state.worker.admission.ready
    app.middleware_stack = app.build_middleware_stack()  # as the app's first call (the lifespan's, in uvicorn) does
    return app


def fastapi_stack(app: FastAPI) -> ASGIApp:
    """The app entered as FastAPI: every request through its router and middleware stack."""

    async def entry(scope: Scope, receive: Receive, send: Send) -> None:
        await FastAPI.__call__(app, scope, receive, send)

    return entry


async def refused(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError(f"{scope['method']} {scope['path']} reached FastAPI's stack")


def answer(app: NormserveApp, hot: bool, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
    """(status, headers, body) of one request, with its access line and the change in its requests counter."""
    return answer_from(app if hot else fastapi_stack(app), method, path, headers, body)


def answer_from(app: ASGIApp, method: str, path: str, headers: dict[str, str], body: bytes, root: str = "") -> Any:
    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False, root_path=root)
        async with httpx.AsyncClient(transport=transport, base_url="http://normserve") as c:
            sent = {"x-request-id": "same-id", "accept-encoding": "identity", **headers}
            return await c.request(method, path, headers=sent, content=body)

    with captured("normserve.access") as lines:
        r = asyncio.run(send())
    (line,) = lines
    fields = {k: v for k, v in vars(line).items() if k in LINE_FIELDS}
    return r.status_code, r.headers.multi_items(), r.content, fields


LINE_FIELDS = ("request_id", "method", "route", "path", "status", "model", "bytes_in", "bytes_out")


@pytest.mark.parametrize(("method", "path", "headers", "body"), CASES, ids=[f"{c[0]} {c[1]}" for c in CASES])
def test_the_hot_path_answers_as_fastapis_stack(
    app: NormserveApp, method: str, path: str, headers: dict[str, str], body: bytes
) -> None:
    fast = answer(app, True, method, path, headers, body)
    slow = answer(app, False, method, path, headers, body)
    assert fast == slow
    route = fast[3]["route"]
    labels = {"method": method, "route": route, "status": str(fast[0])}
    before = REGISTRY.get_sample_value("normserve_http_requests_total", labels) or 0.0
    answer(app, True, method, path, headers, body)
    assert REGISTRY.get_sample_value("normserve_http_requests_total", labels) == before + 1


def test_the_four_inference_routes_are_matched_and_nothing_else(app: NormserveApp) -> None:
    hot = app.hot
    assert hot is not None
    assert [(sorted(r.methods), r.path) for r in app.hot_routes] == [
        (["POST"], "/normalize"),
        (["POST"], "/encode"),
        (["POST"], "/v2/models/{name}/infer"),
        (["POST"], "/v2/models/{name}/versions/{version}/infer"),
    ]
    paths = ("/normalize", "/v2/models/x/infer")
    matched = {p: (m[0].path, m[1]) if (m := hot.match("POST", p)) else None for p in paths}
    assert matched == {
        "/normalize": ("/normalize", {}),
        "/v2/models/x/infer": ("/v2/models/{name}/infer", {"name": "x"}),
    }
    versioned = hot.match("POST", "/v2/models/x/versions/2/infer")
    assert versioned is not None and versioned[1] == {"name": "x", "version": "2"}
    for path in ("/v2/models/x/versions//infer", "/v2/models/x/ready/infer", "/normalize/", "/v2/models/infer", "/"):
        assert hot.match("POST", path) is None, path
    assert hot.match("GET", "/normalize") is None and hot.match("PUT", "/v2/models/x/infer") is None


def test_an_unexpected_error_is_the_same_500_with_the_request_id(
    app: NormserveApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(codec: Any, body: Any, *args: Any, **kwargs: Any) -> Any:
        body.close()  # the body's read, never awaited
        raise RuntimeError("a bug on the hot path")

    monkeypatch.setattr(app.state.worker.plane, "infer", broken)
    logging.getLogger("normserve.errors").disabled = True  # the traceback is expected: keep the output clean
    try:
        fast = answer(app, True, "POST", "/normalize", JSON, b'{"data": [[1.0, 2.0]]}')
        slow = answer(app, False, "POST", "/normalize", JSON, b'{"data": [[1.0, 2.0]]}')
    finally:
        logging.getLogger("normserve.errors").disabled = False
    assert fast == slow
    assert fast[0] == 500 and ("x-request-id", "same-id") in fast[1]


class Tagging:
    """A user's pure-ASGI middleware: every answer gets `x-tag: <path it saw>`."""

    def __init__(self, app: ASGIApp, tag: str) -> None:
        self.app, self.tag = app, tag.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def tagged(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (b"x-tag", self.tag)]}
            await send(message)

        await self.app(scope, receive, tagged)


@pytest.fixture
def tagged() -> NormserveApp:
    """A fresh app with a middleware added after create_app, as an embedder would, and its worker started."""
    app = create_app(Settings(model_dir=MODELS, grpc_port=0, batch_max_size=1))
    assert isinstance(app, NormserveApp)
    app.add_middleware(Tagging, tag="user")
    app.state.worker.lifecycle.start()
    return app


@pytest.mark.parametrize(("method", "path", "headers", "body"), CASES[:3], ids=[f"{c[0]} {c[1]}" for c in CASES[:3]])
def test_middleware_added_at_create_time_runs_on_the_hot_routes(
    tagged: NormserveApp, method: str, path: str, headers: dict[str, str], body: bytes
) -> None:
    slow = answer(tagged, False, method, path, headers, body)  # also starts the app: both chains are built
    tagged.middleware_stack = refused
    fast = answer(tagged, True, method, path, headers, body)
    assert fast == slow
    assert ("x-tag", "user") in fast[1]


def test_a_root_path_is_taken_off_the_path_before_matching(tagged: NormserveApp) -> None:
    body = b'{"data": [[1.0, 2.0, 4.0]]}'
    slow = answer_from(fastapi_stack(tagged), "POST", "/api/normalize", JSON, body, root="/api")
    tagged.middleware_stack = refused
    fast = answer_from(tagged, "POST", "/api/normalize", JSON, body, root="/api")
    assert fast == slow and fast[0] == 200


def test_middleware_added_after_the_app_started_is_refused(tagged: NormserveApp) -> None:
    status, *_ = answer(tagged, True, "POST", "/normalize", JSON, b'{"data": [[1.0, 2.0]]}')  # the first call
    assert status == 200
    with pytest.raises(RuntimeError) as raised:
        tagged.add_middleware(Tagging, tag="late")
    assert str(raised.value) == "Cannot add middleware after an application has started"


async def _by_id(item: int) -> Response:
    return Response(str(item))


async def _plain() -> Response:
    return Response(b"")


def test_a_hot_route_whose_path_needs_a_regex_is_refused_when_the_app_starts() -> None:
    router = APIRouter(route_class=DirectRoute)
    router.post("/items/{item:int}")(hot(_by_id))
    app = NormserveApp()
    app.include_router(router)
    with pytest.raises(TypeError) as raised:
        app.build_middleware_stack()
    assert str(raised.value) == "hot route /items/{item:int}: only whole-segment {name} parameters are matched"


def test_hot_routes_included_with_options_are_refused() -> None:
    router = APIRouter(route_class=DirectRoute)
    router.post("/plain")(hot(_plain))
    with pytest.raises(TypeError) as raised:
        NormserveApp().include_router(router, prefix="/v1")
    assert str(raised.value) == "hot route /plain: include its router without options, or it is not hot"


def test_fastapis_body_limit_is_refused_as_the_hot_routes_would_skip_it() -> None:
    app = NormserveApp(max_body_size=1024)
    with pytest.raises(RuntimeError) as raised:
        app.build_middleware_stack()
    assert str(raised.value) == "NormserveApp: max_body_size is not applied on the hot routes; NORMSERVE_ limits are"
