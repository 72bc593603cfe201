"""app/server/hotpath.py: the inference routes answered outside FastAPI's stack give the answers the stack gives.

One app, its worker started in process; each request goes once through the hot path and once through FastAPI
(the app with `hot` off), and the two answers (status, headers, body), access lines and metrics must match.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client import REGISTRY

from app.server.app import create_app
from app.server.hotpath import HotRoutes, NormserveApp
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
    app.state.worker.start()
    assert app.state.worker.admission.ready
    return app


def answer(app: NormserveApp, hot: bool, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
    """(status, headers, body) of one request, with its access line and the change in its requests counter."""
    saved = app.hot
    app.hot = saved if hot else None

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://normserve") as c:
            sent = {"x-request-id": "same-id", "accept-encoding": "identity", **headers}
            return await c.request(method, path, headers=sent, content=body)

    try:
        with captured("normserve.access") as lines:
            r = asyncio.run(send())
    finally:
        app.hot = saved
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
    matched = {p: (m[0].path, m[1]) if (m := hot.match(p)) else None for p in ("/normalize", "/v2/models/x/infer")}
    assert matched == {
        "/normalize": ("/normalize", {}),
        "/v2/models/x/infer": ("/v2/models/{name}/infer", {"name": "x"}),
    }
    versioned = hot.match("/v2/models/x/versions/2/infer")
    assert versioned is not None and versioned[1] == {"name": "x", "version": "2"}
    for path in ("/v2/models/x/versions//infer", "/v2/models/x/ready/infer", "/normalize/", "/v2/models/infer", "/"):
        assert hot.match(path) is None, path


def test_an_unexpected_error_is_the_same_500_with_the_request_id(
    app: NormserveApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(codec: Any, body: Any, *args: Any, **kwargs: Any) -> Any:
        body.close()  # the body's read, never awaited
        raise RuntimeError("a bug on the hot path")

    monkeypatch.setattr(app.state.worker, "serve", broken)
    logging.getLogger("normserve.errors").disabled = True  # the traceback is expected: keep the output clean
    try:
        fast = answer(app, True, "POST", "/normalize", JSON, b'{"data": [[1.0, 2.0]]}')
        slow = answer(app, False, "POST", "/normalize", JSON, b'{"data": [[1.0, 2.0]]}')
    finally:
        logging.getLogger("normserve.errors").disabled = False
    assert fast == slow
    assert fast[0] == 500 and ("x-request-id", "same-id") in fast[1]


def test_middleware_added_after_create_app_turns_the_hot_path_off() -> None:
    app = create_app(Settings(model_dir=MODELS, grpc_port=0))
    assert isinstance(app, NormserveApp) and isinstance(app.hot, HotRoutes)
    seen: list[str] = []

    class Seeing:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            seen.append(scope.get("path", ""))
            await self.inner(scope, receive, send)

    app.add_middleware(Seeing)
    status, *_ = answer(app, True, "POST", "/normalize", JSON, b'{"data": [[1.0, 2.0]]}')
    assert status == 503 and seen == ["/normalize"]  # through the added middleware; not started: not ready
