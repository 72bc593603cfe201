"""app/server/api/v2/http/tracelog.py: Triton's trace and logging extensions over HTTP, with the official tritonclient.http,
behind the admin token, and what the settings change in the live server (its spans, its log lines).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from tests.server.api.v2.grpc.live import GrpcServer, grpc_server
from tests.server.otlp_receiver import Receiver, otlp_receiver, tracing_env
from tests.triton_clients import TritonOn

TOKEN = "s3cret-admin"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEFAULT_TRACE = {
    "trace_level": ["TIMESTAMPS"],
    "trace_rate": "1",
    "trace_count": "-1",
    "trace_file": "",
    "log_frequency": "0",
    "trace_mode": "opentelemetry",
}
DEFAULT_LOG = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "ISO8601",
}
ROUTES = [
    ("GET", "/v2/trace/setting"),
    ("POST", "/v2/trace/setting"),
    ("GET", "/v2/models/layernorm/trace/setting"),
    ("POST", "/v2/models/layernorm/trace/setting"),
    ("GET", "/v2/logging"),
    ("POST", "/v2/logging"),
]
TRITON = TritonOn("admin", "http")  # tests/conftest.py's `triton`, with the token on each call
MISSING = "authorization: expected `Authorization: Bearer <token>` (NORMSERVE_ADMIN_TOKEN is set)"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as rx:
        yield rx


@pytest.fixture(scope="module")
def admin(receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    env = {**tracing_env(receiver), "NORMSERVE_ADMIN_TOKEN": TOKEN}
    with grpc_server(tmp_path_factory.mktemp("control"), env) as server:
        yield server


@pytest.fixture(autouse=True)
def defaults(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that takes tritonclient.http (tests/conftest.py's `triton`, TRITON here): the settings put
    back to their defaults."""
    yield
    if "triton" not in request.fixturenames:
        return
    client: th.InferenceServerClient = request.getfixturevalue("triton")
    for model in ("layernorm", "encoder"):
        client.update_trace_settings(model, {k: None for k in ("trace_level", "trace_rate", "trace_count")}, AUTH)
    client.update_trace_settings(settings={k: None for k in ("trace_level", "trace_rate", "trace_count")}, headers=AUTH)
    client.update_log_settings({"log_info": True, "log_verbose_level": 0}, headers=AUTH)


def test_v2_lists_the_trace_and_logging_extensions(admin: GrpcServer) -> None:
    assert {"trace", "logging"} <= set(httpx.get(admin.base + "/v2").json()["extensions"])


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m}-{p}" for m, p in ROUTES])
@pytest.mark.parametrize(
    ("authorization", "status", "error"),
    [
        (None, 401, MISSING),
        ("Basic czNjcmV0", 401, MISSING),
        ("Bearer", 401, MISSING),
        ("Bearer wrong", 403, "authorization: wrong admin token"),
        (f"Bearer {TOKEN}", 200, None),
        (f"bearer {TOKEN}", 200, None),
    ],
    ids=["none", "basic", "no-token", "wrong", "right", "lower-case"],
)
def test_every_control_route_takes_the_admin_token(
    admin: GrpcServer, method: str, path: str, authorization: str | None, status: int, error: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    r = httpx.request(method, admin.base + path, headers=headers, content=b"{}" if method == "POST" else None)
    assert r.status_code == status
    if error is not None:
        assert r.json() == {"error": error}
    if status == 401:
        assert r.headers["www-authenticate"] == 'Bearer realm="normserve"'


def test_trace_settings_round_trip_through_tritonclient(triton: th.InferenceServerClient) -> None:
    assert triton.get_trace_settings(headers=AUTH) == DEFAULT_TRACE
    changed = triton.update_trace_settings(settings={"trace_rate": "3", "trace_count": "5"}, headers=AUTH)
    assert changed == {**DEFAULT_TRACE, "trace_rate": "3", "trace_count": "5"}
    assert triton.get_trace_settings(headers=AUTH) == changed
    model = triton.update_trace_settings("encoder", {"trace_level": ["OFF"], "trace_rate": "2"}, headers=AUTH)
    assert model == {**changed, "trace_level": ["OFF"], "trace_rate": "2"}  # its own values, the rest server-wide
    assert triton.get_trace_settings("encoder", headers=AUTH) == model
    assert triton.get_trace_settings("layernorm", headers=AUTH) == changed
    cleared = triton.update_trace_settings("encoder", {"trace_level": None, "trace_rate": None}, headers=AUTH)
    assert cleared == changed


def test_log_settings_round_trip_through_tritonclient(triton: th.InferenceServerClient) -> None:
    assert triton.get_log_settings(headers=AUTH) == DEFAULT_LOG
    debug = triton.update_log_settings({"log_verbose_level": 1}, headers=AUTH)
    assert debug == {**DEFAULT_LOG, "log_verbose_level": 1}
    warning = triton.update_log_settings({"log_verbose_level": 0, "log_info": False}, headers=AUTH)
    assert warning == {**DEFAULT_LOG, "log_info": False}
    assert triton.get_log_settings(headers=AUTH) == warning


def test_log_info_off_stops_the_access_lines_without_a_restart(
    admin: GrpcServer, triton: th.InferenceServerClient
) -> None:
    triton.update_log_settings({"log_info": False}, headers=AUTH)
    httpx.post(admin.base + "/normalize", json={"data": [[1.0, 2.0]]}, headers={"X-Request-ID": "quiet"})
    triton.update_log_settings({"log_info": True}, headers=AUTH)
    httpx.post(admin.base + "/normalize", json={"data": [[1.0, 2.0]]}, headers={"X-Request-ID": "heard"})
    admin.request_line("heard")
    assert not [d for d in admin.log_lines() if d.get("request_id") == "quiet"]


def test_verbose_logging_turns_on_alone_on_a_server_at_warning(
    admin: GrpcServer, triton: th.InferenceServerClient
) -> None:
    """As in Triton, log_verbose_level needs no log_info: info (the access lines) stays off."""
    triton.update_log_settings({"log_info": False}, headers=AUTH)
    verbose = triton.update_log_settings({"log_verbose_level": 1}, headers=AUTH)
    assert verbose == {**DEFAULT_LOG, "log_info": False, "log_verbose_level": 1}
    assert triton.get_log_settings(headers=AUTH) == verbose
    httpx.post(admin.base + "/normalize", json={"data": [[1.0, 2.0]]}, headers={"X-Request-ID": "verbose-quiet"})
    triton.update_log_settings({"log_info": True}, headers=AUTH)
    httpx.post(admin.base + "/normalize", json={"data": [[1.0, 2.0]]}, headers={"X-Request-ID": "verbose-heard"})
    admin.request_line("verbose-heard")
    assert not [d for d in admin.log_lines() if d.get("request_id") == "verbose-quiet"]


@pytest.mark.parametrize(
    ("path", "body", "error"),
    [
        (
            "/v2/trace/setting",
            {"trace_level": ["TENSORS"]},
            "trace_level: expected ['OFF'] or ['TIMESTAMPS'] (TENSORS is not supported), got ['TENSORS']",
        ),
        ("/v2/trace/setting", {"trace_rate": "0"}, "trace_rate: expected an integer >= 1 (as a string), got '0'"),
        ("/v2/trace/setting", {"trace_count": "-2"}, "trace_count: expected an integer >= -1 (as a string), got '-2'"),
        (
            "/v2/trace/setting",
            {"trace_rate": "\uff15"},
            "trace_rate: expected an integer >= 1 (as a string), got '\uff15'",
        ),
        ("/v2/trace/setting", {"trace_rate": "1_0"}, "trace_rate: expected an integer >= 1 (as a string), got '1_0'"),
        (
            "/v2/trace/setting",
            {"trace_count": " 5 "},
            "trace_count: expected an integer >= -1 (as a string), got ' 5 '",
        ),
        (
            "/v2/trace/setting",
            {"trace_file": "/tmp/t.json"},
            "trace_file: is '' in opentelemetry trace mode and cannot change",
        ),
        (
            "/v2/trace/setting",
            {"trace_rates": "2"},
            "trace_rates: unknown trace setting; expected one of trace_level, trace_rate, trace_count, trace_file, log_frequency, trace_mode",
        ),
        ("/v2/models/layernorm/trace/setting", [1], "body: expected a JSON object of settings"),
        (
            "/v2/logging",
            {"log_warning": False},
            "logging: one log level turns on its severity and all above it; {'log_verbose_level': 0, 'log_info': True, 'log_warning': False, 'log_error': True} is no level",
        ),
        (
            "/v2/logging",
            {"log_format": "default"},
            "log_format: is 'ISO8601' and cannot change (JSON lines, ISO 8601 times, on stderr)",
        ),
        ("/v2/logging", {"log_info": "yes"}, "log_info: expected true or false, got 'yes'"),
        ("/v2/logging", {"log_verbose_level": -1}, "log_verbose_level: expected an integer >= 0, got -1"),
    ],
)
def test_a_bad_setting_is_400_and_changes_nothing(admin: GrpcServer, path: str, body: Any, error: str) -> None:
    before = httpx.get(admin.base + path, headers=AUTH).json()
    r = httpx.post(admin.base + path, json=body, headers=AUTH)
    assert (r.status_code, r.json()) == (400, {"error": error})
    assert httpx.get(admin.base + path, headers=AUTH).json() == before


def test_an_unknown_models_trace_setting_is_404(admin: GrpcServer) -> None:
    r = httpx.get(admin.base + "/v2/models/nope/trace/setting", headers=AUTH)
    assert r.status_code == 404


def _traced_normalize(admin: GrpcServer, path: str = "/normalize") -> tuple[str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    body: dict[str, Any] = {"data": [[1.0, 2.0]]}
    if path == "/encode":
        body = {"data": [[0.1] * 128], "model": "encoder"}
    headers = {"traceparent": f"00-{trace_id}-{span_id}-01", "X-Request-ID": secrets.token_hex(8)}
    r = httpx.post(admin.base + path, json=body, headers=headers)
    assert r.status_code == 200
    return trace_id, r.headers["x-request-id"]


def test_trace_count_and_model_level_decide_which_requests_are_exported(
    admin: GrpcServer, receiver: Receiver, triton: th.InferenceServerClient
) -> None:
    triton.update_trace_settings(settings={"trace_count": "1"}, headers=AUTH)
    first, _ = _traced_normalize(admin)
    second, second_id = _traced_normalize(admin)  # no trace left
    assert triton.get_trace_settings(headers=AUTH)["trace_count"] == "0"
    triton.update_trace_settings(settings={"trace_count": None}, headers=AUTH)
    triton.update_trace_settings("layernorm", {"trace_level": ["OFF"]}, headers=AUTH)
    off, _ = _traced_normalize(admin)
    encoded, _ = _traced_normalize(admin, "/encode")  # another model: still traced
    receiver.trace(first, 5)
    receiver.trace(encoded, 5)
    time.sleep(0.5)  # ten export periods
    assert not {second, off} & {s.trace_id for s in receiver.spans}
    assert admin.request_line(second_id)["trace_id"] == second  # the caller's trace, still in the log


def test_timestamps_without_an_exporter_is_refused(tmp_path_factory: pytest.TempPathFactory) -> None:
    with grpc_server(tmp_path_factory.mktemp("no-exporter"), {"NORMSERVE_ADMIN_TOKEN": TOKEN}) as server:
        r = httpx.post(server.base + "/v2/trace/setting", json={"trace_level": ["TIMESTAMPS"]}, headers=AUTH)
        assert r.status_code == 400
        assert r.json()["error"] == (
            "trace_level: TIMESTAMPS needs an OTLP endpoint: "
            "OTEL_EXPORTER_OTLP_ENDPOINT is not set (or OTEL_SDK_DISABLED is true)"
        )
        assert httpx.get(server.base + "/v2/trace/setting", headers=AUTH).json()["trace_level"] == ["OFF"]


def test_tritonclient_raises_on_a_missing_token(admin: GrpcServer) -> None:
    with (
        th.InferenceServerClient(admin.base.removeprefix("http://")) as client,
        pytest.raises(InferenceServerException) as e,
    ):
        client.get_trace_settings()
    assert e.value.status() == "401"
