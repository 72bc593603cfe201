"""app/server/telemetry/observability.py: the request middleware. X-Request-ID echoed when sane and generated otherwise, one
log line per request with its route template, status, model and byte counts (never a body or a query), and the
request metrics labelled by route template. Over a real `normserve serve`, plus the real app in process where a
route must fail in a way no real route does.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import anyio.to_thread
import httpx
import pytest
from prometheus_client import REGISTRY
from starlette.requests import Request
from starlette.responses import Response

from app.server.app import create_app
from app.server.telemetry import record
from app.settings import Settings
from tests.live_server import MODELS
from tests.server.log_records import captured
from tests.server.logged_server import LoggedServer
from tests.server.prometheus import delta, scrape, scrape_until_moved

SECRET = 0.123456789  # a value in request bodies; it must never reach the logs
QUERY_SECRET = "0.987654321"
ENCODER_ROW = [SECRET] + [0.25] * 127

REQUESTS = [
    # (method, path, json body, route, status, model)
    ("POST", "/normalize", {"data": [[SECRET, 0.2, 0.3]]}, "/normalize", 200, "layernorm"),
    # /normalize resolves its model (default layernorm) before it reads data: a bad tensor or the numpy backend
    # still names it; an unknown model names none
    ("POST", "/normalize", {"data": [[SECRET, 0.2], [0.3]]}, "/normalize", 422, "layernorm"),
    ("POST", "/normalize", {"data": [[SECRET, 0.2]], "backend": "numpy"}, "/normalize", 200, "layernorm"),
    (
        "POST",
        "/normalize",
        {"data": [[SECRET, 0.2]], "model": "layernorm", "version": 1},
        "/normalize",
        200,
        "layernorm",
    ),
    ("POST", "/normalize", {"data": [[SECRET, 0.2]], "model": "gpt"}, "/normalize", 404, None),
    ("POST", "/normalize", {"data": [[SECRET, 0.2]], "version": 2}, "/normalize", 404, None),
    ("POST", "/encode", {"data": [ENCODER_ROW], "model": "encoder-preln"}, "/encode", 200, "encoder-preln"),
    (
        "POST",
        f"/v2/models/layernorm/infer?note={QUERY_SECRET}",
        {"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [SECRET, 0.5]}]},
        "/v2/models/{name}/infer",
        200,
        "layernorm",
    ),
    ("GET", "/v2/models/encoder", None, "/v2/models/{name}", 200, "encoder"),
    ("GET", "/no/such/route", None, "unmatched", 404, None),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "route", "status", "model"), REQUESTS, ids=[f"{r[0]}-{r[4]}-{r[1]}" for r in REQUESTS]
)
def test_each_request_is_one_json_line_with_its_fields(
    logged: LoggedServer, method: str, path: str, body: Any, route: str, status: int, model: str | None
) -> None:
    r = httpx.request(method, logged.base + path, json=body)
    assert r.status_code == status
    line = logged.request_line(r.headers["x-request-id"])
    assert {k: line[k] for k in ("logger", "level", "method", "route", "status", "model")} == {
        "logger": "normserve.access",
        "level": "info",
        "method": method,
        "route": route,
        "status": status,
        "model": model,
    }
    assert line["path"] == path.split("?")[0]  # never the query string
    assert line["bytes_in"] == len(r.request.content)
    assert line["bytes_out"] == int(r.headers["content-length"])  # on the wire: V2 answers gzip to httpx
    assert 0 < line["duration_ms"] < 60_000


def test_bytes_in_counts_a_compressed_body_as_sent(logged: LoggedServer) -> None:
    body = gzip.compress(json.dumps({"data": [[SECRET, 0.2, 0.3]] * 50}).encode())
    headers = {"Content-Encoding": "gzip", "X-Request-ID": "gzip-bytes-in"}
    assert httpx.post(logged.base + "/normalize", content=body, headers=headers).status_code == 200
    assert logged.request_line("gzip-bytes-in")["bytes_in"] == len(body)


def test_no_log_line_holds_a_tensor_value_or_a_query(logged: LoggedServer) -> None:
    for method, path, body, *_ in REQUESTS:  # runs on its own too: make the requests again
        httpx.request(method, logged.base + path, json=body)
    text = logged.log.read_text()
    assert str(SECRET) not in text and "123456789" not in text
    assert QUERY_SECRET not in text


@pytest.mark.parametrize(
    ("sent", "echoed"),
    [
        ("abc123", True),
        ("6f1c2a9e-0b7d-4a51-9d43-1f0e8c2b7a66", True),
        ("trace:a1b2/c3=+_.-", True),
        ("x" * 128, True),  # the longest echoed
        ("", False),
        ("x" * 129, False),  # too long
        ("has space", False),
        ("quote\"'<>", False),
        ("caf\u00e9", False),  # not ASCII
    ],
)
def test_request_id_is_echoed_when_sane_else_generated(logged: LoggedServer, sent: str, echoed: bool) -> None:
    r = httpx.post(
        logged.base + "/normalize", json={"data": [[SECRET, 1.0]]}, headers={"X-Request-ID": sent.encode("utf-8")}
    )
    rid = r.headers["x-request-id"]
    if echoed:
        assert rid == sent
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", rid), rid  # uuid4 hex
    assert logged.request_line(rid)["status"] == 200


def test_a_request_without_an_id_gets_a_new_one_each_time(logged: LoggedServer) -> None:
    ids = {httpx.get(logged.base + "/v2/health/live").headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3 and all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in ids)


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("POST", "/normalize", {"json": {"data": [[1.0, 2.0], [3.0]]}}, 422),
        ("POST", "/normalize", {"content": b"data=1", "headers": {"Content-Type": "text/plain"}}, 415),
        ("POST", "/v2/models/layernorm/infer", {"content": b"{not json"}, 400),
        ("POST", "/v2/models/nope/infer", {"json": {"inputs": []}}, 404),
        ("GET", "/normalize", {}, 405),
        ("GET", "/nowhere", {}, 404),
    ],
)
def test_error_responses_carry_the_request_id(
    logged: LoggedServer, method: str, path: str, kwargs: dict[str, Any], status: int
) -> None:
    headers = {**kwargs.pop("headers", {}), "X-Request-ID": f"err-{status}-{method}"}
    r = httpx.request(method, logged.base + path, headers=headers, **kwargs)
    assert r.status_code == status and "error" in r.json()
    assert r.headers["x-request-id"] == f"err-{status}-{method}"
    assert logged.request_line(f"err-{status}-{method}")["status"] == status


# ---- request metrics: labelled by route template, never by raw path ---------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "label", "route", "status"),
    [
        ("GET", "/v2/models/encoder", "GET", "/v2/models/{name}", "200"),
        ("GET", "/v2/models/no-such-model-7f3a", "GET", "/v2/models/{name}", "404"),
        ("GET", "/v2/models/layernorm/versions/1/ready", "GET", "/v2/models/{name}/versions/{version}/ready", "200"),
        ("DELETE", "/normalize", "DELETE", "/normalize", "405"),
        ("GET", "/no/such/path/7f3a", "GET", "unmatched", "404"),
        ("PROPFIND", "/normalize", "other", "/normalize", "405"),  # methods are a bounded set too
    ],
)
def test_routes_are_labelled_by_template_never_by_raw_path(
    client: httpx.Client, method: str, path: str, label: str, route: str, status: str
) -> None:
    before = scrape(client)
    assert client.request(method, path).status_code == int(status)
    labels = {"method": label, "route": route, "status": status}
    after = scrape_until_moved(client, before, "normserve_http_requests_total", 1, **labels)
    assert delta(before, after, "normserve_http_requests_total", **labels) == 1
    assert delta(before, after, "normserve_http_request_duration_seconds_count", **labels) == 1
    if path != route:
        assert not [key for key in after if any(v == path for _, v in key[1])], "a raw path became a label value"


# ---- in process: the real app with routes that fail, or name their model from a worker thread -------------


@pytest.fixture
def access_lines() -> Iterator[list[logging.LogRecord]]:
    """The request lines this process logs while the test runs (normserve.access at level info)."""
    with captured("normserve.access") as records:
        yield records


async def _boom() -> None:
    raise RuntimeError("a bug on a request path")


async def _noted_in_a_thread(request: Request) -> Response:
    await anyio.to_thread.run_sync(record.note_model, request.path_params["name"])
    return Response("noted")


def requests_in_process(*requests: tuple[str, str, dict[str, str]]) -> list[httpx.Response]:
    app = create_app(Settings(model_dir=MODELS))
    app.add_api_route("/boom", _boom)
    app.add_api_route("/noted/{name}", _noted_in_a_thread)

    async def send() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://normserve") as c:
            return [await c.request(method, path, headers=headers) for method, path, headers in requests]

    return asyncio.run(send())


def test_an_error_past_every_handler_is_logged_and_counted_as_a_500_with_its_id(
    access_lines: list[logging.LogRecord],
) -> None:
    labels = {"method": "GET", "route": "/boom", "status": "500"}
    before = REGISTRY.get_sample_value("normserve_http_requests_total", labels) or 0.0
    (r,) = requests_in_process(("GET", "/boom", {"X-Request-ID": "boom-1"}))
    assert r.status_code == 500 and r.headers["x-request-id"] == "boom-1"
    (line,) = access_lines
    fields = {k: vars(line)[k] for k in ("request_id", "route", "status", "model")}
    assert fields == {"request_id": "boom-1", "route": "/boom", "status": 500, "model": None}
    assert REGISTRY.get_sample_value("normserve_http_requests_total", labels) == before + 1


def test_note_model_from_a_worker_thread_names_the_model_of_its_own_request(
    access_lines: list[logging.LogRecord],
) -> None:
    record.note_model("outside-any-request")  # no request is being served: noted nowhere
    responses = requests_in_process(("GET", "/noted/alpha", {}), ("GET", "/v2/health/live", {}))
    assert [r.status_code for r in responses] == [200, 200]
    assert [(vars(line)["path"], vars(line)["model"]) for line in access_lines] == [
        ("/noted/alpha", "alpha"),
        ("/v2/health/live", None),
    ]
