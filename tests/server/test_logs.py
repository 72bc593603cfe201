"""Structured logs: JSON lines on stderr, one per request with its id, route, status and model, never tensor data."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks import servers
from tests.live_server import MODELS, cli_server, server_env

SECRET = 0.123456789  # a value in request bodies; it must never reach the logs
QUERY_SECRET = "0.987654321"
ENCODER_ROW = [SECRET] + [0.25] * 127


@dataclass
class LoggedServer:
    base: str
    log: Path

    def lines(self) -> list[dict[str, Any]]:
        # Plain `uvicorn app.main:app` prints two plain lines before the app can set up logging.
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]

    def request_line(self, request_id: str, timeout: float = 10) -> dict[str, Any]:
        """The access line of a request: written once the response is sent, so wait for it a little."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [d for d in self.lines() if d.get("request_id") == request_id]
            if found:
                assert len(found) == 1, found
                return found[0]
            time.sleep(0.02)
        raise AssertionError(f"no log line for request {request_id}")


@contextmanager
def logged_server(
    tmp: Path, level: str, launcher: str = "normserve", model_dir: Path = MODELS, wait: str = "/v2/health/ready"
) -> Iterator[LoggedServer]:
    """A real server with its output in a file: `normserve serve`, or plain `uvicorn app.main:app`."""
    env = server_env({"NORMSERVE_MODEL_DIR": str(model_dir), "NORMSERVE_LOG_LEVEL": level})
    log = tmp / f"{launcher}-{level}.log"  # stdout too: uvicorn's access log goes there
    if launcher == "normserve":
        server = cli_server([str(Path(sys.executable).parent / "normserve"), "serve"], env, ready=wait, output=log)
    else:  # uvicorn's own access log is on by default here: the app must turn it off
        command = servers.uvicorn_command("--log-level", "info")
        server = servers.server_process(command, ready=wait, env=env, timeout=90, stop_timeout=30, output=log)
    with server as running:
        yield LoggedServer(running.base, log)


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedServer]:
    with logged_server(tmp_path_factory.mktemp("logs"), "info") as server:
        yield server


REQUESTS = [
    # (method, path, json body, route, status, model)
    ("POST", "/normalize", {"data": [[SECRET, 0.2, 0.3]]}, "/normalize", 200, "layernorm"),
    ("POST", "/normalize", {"data": [[SECRET, 0.2], [0.3]]}, "/normalize", 422, None),
    ("POST", "/normalize", {"data": [[SECRET, 0.2]], "backend": "numpy"}, "/normalize", 200, None),
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


@pytest.mark.parametrize(
    ("sent", "echoed"),
    [
        ("abc123", True),
        ("6f1c2a9e-0b7d-4a51-9d43-1f0e8c2b7a66", True),
        ("trace:a1b2/c3=+_.-", True),
        ("", False),
        ("x" * 129, False),  # too long
        ("has space", False),
        ("quote\"'<>", False),
    ],
)
def test_request_id_is_echoed_when_sane_else_generated(logged: LoggedServer, sent: str, echoed: bool) -> None:
    r = httpx.post(logged.base + "/normalize", json={"data": [[SECRET, 1.0]]}, headers={"X-Request-ID": sent})
    rid = r.headers["x-request-id"]
    if echoed:
        assert rid == sent
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", rid), rid  # uuid4 hex
    assert logged.request_line(rid)["status"] == 200


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


def test_start_up_lines_are_structured(logged: LoggedServer) -> None:
    lines = logged.lines()
    loaded = {d["model"]: d for d in lines if d["msg"].startswith("loaded model")}
    assert sorted(loaded) == ["encoder", "encoder-preln", "layernorm"]
    assert all(d["load_seconds"] > 0 and len(d["sha256"]) == 64 for d in loaded.values())
    (ready,) = [d for d in lines if d["msg"].startswith("ready")]
    assert sorted(ready["parity_max_abs_diff"]) == sorted(loaded)
    assert max(ready["parity_max_abs_diff"].values()) < 1e-4


def test_every_line_is_json_and_no_tensor_value_or_query_is_logged(logged: LoggedServer) -> None:
    for method, path, body, *_ in REQUESTS:  # runs on its own too: make the requests again
        httpx.request(method, logged.base + path, json=body)
    text = logged.log.read_text()
    for line in text.splitlines():
        assert isinstance(json.loads(line), dict), line
    assert str(SECRET) not in text and "123456789" not in text
    assert QUERY_SECRET not in text


@pytest.mark.parametrize(("launcher", "level", "request_lines"), [("uvicorn", "info", 1), ("normserve", "warning", 0)])
def test_log_level_and_no_duplicate_access_lines(tmp_path: Path, launcher: str, level: str, request_lines: int) -> None:
    with logged_server(tmp_path, level, launcher) as server:
        r = httpx.post(server.base + "/normalize", json={"data": [[1.0, 2.0]]}, headers={"X-Request-ID": "dup-check"})
        assert r.status_code == 200
        if request_lines:
            server.request_line("dup-check")
        else:
            time.sleep(0.5)  # a line, if any, is written as the response goes out
    text = server.log.read_text()
    assert text.count("dup-check") == request_lines
    assert '"POST /normalize HTTP/1.1"' not in text  # uvicorn's own access line
    assert any(d["msg"].startswith("ready") for d in server.lines()) == (level == "info")


def test_not_ready_is_logged_as_an_error_with_its_reason(tmp_path: Path) -> None:
    models = tmp_path / "models"
    shutil.copytree(MODELS, models)
    (models / "manifest.json").unlink()
    with logged_server(tmp_path, "info", "uvicorn", models, wait="/v2/health/live") as server:
        deadline = time.monotonic() + 30
        while not [d for d in server.lines() if d["msg"].startswith("not ready")]:
            assert time.monotonic() < deadline, server.log.read_text()
            time.sleep(0.05)
    (line,) = [d for d in server.lines() if d["msg"].startswith("not ready")]
    assert line["level"] == "error" and line["logger"] == "normserve"
    assert line["reason"].startswith("model check failed: ") and "manifest missing" in line["reason"]
