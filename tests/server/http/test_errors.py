"""app/server/http/errors.py: every error becomes {"error": message} with its status, which differs on REST and V2
routes for invalid input; messages are printable and bounded (app/errors.py's `printable`); an unexpected error is a bare 500 with the request's
X-Request-ID and no traceback, which goes to the log instead.

Over the live server where real requests raise the error; in process, on the real app with a few routes added,
for the errors no real route raises on demand (every class of the table, an unexpected exception).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import (
    MESSAGE_LIMIT,
    InvalidInput,
    MalformedBody,
    ModelNotFound,
    NormserveError,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    Timeout,
    UnsupportedMediaType,
)
from app.server.app import create_app
from app.settings import Settings
from tests.live_server import MODELS
from tests.server.log_records import captured

# (error class, message, field, REST status, V2 status)
ERRORS: list[tuple[type[NormserveError], str, str | None, int, int]] = [
    (MalformedBody, "not valid JSON (unexpected end of data)", "body", 400, 400),
    (InvalidInput, "expected a finite number > 0, got -1.0", "eps", 422, 400),
    (PayloadTooLarge, "body exceeds 65536 bytes (NORMSERVE_MAX_BODY_BYTES)", "body", 413, 413),
    (
        UnsupportedMediaType,
        "Content-Type 'text/plain' is not supported; send application/json",
        "content-type",
        415,
        415,
    ),
    (ModelNotFound, "unknown model 'gpt'; available: encoder, encoder-preln, layernorm", "model", 404, 404),
    (Overloaded, "1 requests in flight, the limit (NORMSERVE_MAX_IN_FLIGHT)", None, 503, 503),
    (NotReady, "server is not ready: models are loading", None, 503, 503),
    (Timeout, "inference took longer than 0.5 s (NORMSERVE_REQUEST_TIMEOUT_S)", None, 504, 504),
    (NormserveError, "an error the table does not name", None, 500, 500),
]
RAISED = {cls.__name__: (cls, message, field) for cls, message, field, *_ in ERRORS}
LEAKS = ("Traceback", 'File "', "/work/", "site-packages", ".py", "RuntimeError", "failed at")


async def _raise(kind: str) -> None:
    cls, message, field = RAISED[kind]
    raise cls(message, field)


async def _raise_message(message: str, field: str) -> None:
    raise InvalidInput(message, field)


async def _validated(n: int) -> dict[str, int]:
    return {"n": n}  # pragma: no cover - the tests send only what fails validation


async def _teapot() -> None:
    raise StarletteHTTPException(418, "short and stout", headers={"X-Teapot": "yes"})


async def _boom() -> None:
    raise RuntimeError(f"failed at {MODELS.parent / 'app' / 'core' / 'runtime.py'}")  # as a traceback names files


@pytest.fixture(scope="module")
def app() -> FastAPI:
    """The real app (not started: no lifespan), with routes that raise on demand under a REST and a V2 path."""
    app = create_app(Settings(model_dir=MODELS))
    for prefix in ("", "/v2"):
        app.add_api_route(prefix + "/raise/{kind}", _raise)
        app.add_api_route(prefix + "/raise-message", _raise_message)
        app.add_api_route(prefix + "/validated", _validated)
    app.add_api_route("/teapot", _teapot)
    app.add_api_route("/boom", _boom)
    return app


def call(app: FastAPI, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://normserve") as c:
            return await c.request(method, path, **kwargs)

    return asyncio.run(send())


# ---- domain errors: the status of each class, on REST and V2 routes -------------------------------------


@pytest.mark.parametrize("protocol", ["rest", "v2"])
@pytest.mark.parametrize(("cls", "message", "field", "rest", "v2"), ERRORS, ids=[e[0].__name__ for e in ERRORS])
def test_each_error_class_answers_its_status_with_its_whole_message(
    app: FastAPI, protocol: str, cls: type[NormserveError], message: str, field: str | None, rest: int, v2: int
) -> None:
    r = call(app, "GET", ("/v2" if protocol == "v2" else "") + f"/raise/{cls.__name__}")
    assert r.status_code == (v2 if protocol == "v2" else rest)
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"error": f"{field}: {message}" if field else message}
    assert r.headers.get("retry-after") == ("1" if r.status_code == 503 else None)  # only 503s say when to retry


V2_INPUT = {"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}
LIVE = [
    # (REST request, V2 request, REST status, V2 status, REST message, V2 message): the same error on both
    pytest.param(
        ("/normalize", {"json": {"data": [[1.0, 2.0]], "eps": -1}}),
        ("/v2/models/layernorm/infer", {"json": {"inputs": [V2_INPUT], "parameters": {"eps": -1.0}}}),
        422,
        400,
        "eps: expected a finite number > 0, got -1.0",
        "parameters.eps: expected a finite number > 0, got -1.0",
        id="invalid-input",
    ),
    pytest.param(
        ("/normalize", {"content": b"{not json"}),
        ("/v2/models/layernorm/infer", {"content": b"{not json"}),
        400,
        400,
        "body: not valid JSON (unexpected character, expected a string key: line 1 column 2 (char 1))",
        "body: not valid JSON (unexpected character, expected a string key: line 1 column 2 (char 1))",
        id="malformed-body",
    ),
    pytest.param(
        ("/normalize", {"content": b"{}", "headers": {"Content-Encoding": "br"}}),
        ("/v2/models/layernorm/infer", {"content": b"{}", "headers": {"Content-Encoding": "br"}}),
        415,
        415,
        "body: Content-Encoding 'br' is not supported; use gzip or deflate",
        "body: Content-Encoding 'br' is not supported; use gzip or deflate",
        id="unsupported-encoding",
    ),
    pytest.param(
        ("/encode", {"json": {"data": [[1.0]], "model": "gpt"}}),
        ("/v2/models/gpt/infer", {"json": {"inputs": [V2_INPUT]}}),
        404,
        404,
        "model: unknown model 'gpt'; available: encoder, encoder-preln, layernorm",
        "model: unknown model 'gpt'; available: encoder, encoder-preln, layernorm",
        id="model-not-found",
    ),
]


@pytest.mark.parametrize(("rest", "v2", "rest_status", "v2_status", "rest_message", "v2_message"), LIVE)
def test_the_same_error_on_the_real_rest_and_v2_routes_answers_each_protocols_status(
    client: httpx.Client,
    rest: tuple[str, dict[str, Any]],
    v2: tuple[str, dict[str, Any]],
    rest_status: int,
    v2_status: int,
    rest_message: str,
    v2_message: str,
) -> None:
    for (path, kwargs), status, message in ((rest, rest_status, rest_message), (v2, v2_status, v2_message)):
        r = client.post(path, **kwargs)
        assert (r.status_code, r.json()) == (status, {"error": message}), path


# ---- framework errors: validation, unknown routes and methods, other HTTP exceptions ---------------------


@pytest.mark.parametrize(
    ("query", "message"),
    [("?n=abc", "n: Input should be a valid integer, unable to parse string as an integer"), ("", "n: Field required")],
    ids=["not-an-integer", "missing"],
)
@pytest.mark.parametrize(("prefix", "status"), [("", 422), ("/v2", 400)], ids=["rest", "v2"])
def test_a_validation_error_names_the_field_422_on_rest_400_on_v2(
    app: FastAPI, prefix: str, status: int, query: str, message: str
) -> None:
    r = call(app, "GET", f"{prefix}/validated{query}")
    assert (r.status_code, r.json()) == (status, {"error": message})


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("GET", "/nope", 404, None),
        ("GET", "/v2/nothing", 404, None),
        ("DELETE", "/normalize", 405, "POST"),
        ("POST", "/v2/health/live", 405, "GET"),
    ],
)
def test_an_unknown_route_or_method_is_a_json_no_route(
    client: httpx.Client, method: str, path: str, status: int, allow: str | None
) -> None:
    r = client.request(method, path)
    assert (r.status_code, r.json()) == (status, {"error": f"no route {method} {path}"})
    assert r.headers["content-type"] == "application/json"
    assert r.headers.get("allow") == allow


def test_another_http_exception_keeps_its_status_detail_and_headers(app: FastAPI) -> None:
    r = call(app, "GET", "/teapot")
    assert (r.status_code, r.json(), r.headers["x-teapot"]) == (418, {"error": "short and stout"}, "yes")


# ---- printable, bounded messages -------------------------------------------------------------------------


def test_a_domain_error_echoing_client_text_answers_it_escaped_and_bounded(app: FastAPI) -> None:
    r = call(app, "GET", "/raise-message", params={"message": "unknown field " + "k" * 5000, "field": "\u202edata"})
    assert r.status_code == 422
    assert r.json() == {"error": "\\u202edata: unknown field " + "k" * (MESSAGE_LIMIT - 27) + "\u2026"}


# ---- the unexpected 500 ----------------------------------------------------------------------------------


@pytest.fixture
def error_log() -> Iterator[list[logging.LogRecord]]:
    """The records of normserve.errors (the unexpected errors' tracebacks) while the test runs."""
    with captured("normserve.errors") as records:
        yield records


@pytest.mark.parametrize("sent_id", ["trace-500", None], ids=["client-id", "no-id"])
def test_an_unexpected_error_is_a_bare_500_with_the_request_id_and_the_traceback_only_in_the_log(
    app: FastAPI, error_log: list[logging.LogRecord], sent_id: str | None
) -> None:
    r = call(app, "GET", "/boom", headers={"X-Request-ID": sent_id} if sent_id else {})
    assert (r.status_code, r.json()) == (500, {"error": "internal error"})
    assert r.headers["content-type"] == "application/json"
    if sent_id:
        assert r.headers["x-request-id"] == sent_id
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])
    assert not [leak for leak in LEAKS if leak.encode() in r.content]
    (line,) = error_log
    assert line.getMessage() == "unexpected error on GET /boom" and line.levelno == logging.ERROR
    assert line.exc_info is not None and isinstance(line.exc_info[1], RuntimeError)
