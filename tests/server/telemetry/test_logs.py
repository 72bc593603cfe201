"""app/server/telemetry/logs.py: JSON log lines. JsonFormatter's fields, configure() for `uvicorn app.main:app`, the log config
`normserve serve` hands uvicorn; and over real servers, the lines both launchers print at each level.

What the per-request line holds is the middleware's (tests/server/telemetry/test_observability.py).
"""

from __future__ import annotations

import io
import json
import logging
import logging.config
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from app.server.telemetry import logs
from tests.live_server import MODELS
from tests.repositories import broken_copy, not_ready_reason, sha256sum_identity
from tests.server.log_records import captured
from tests.server.logged_server import LoggedServer, logged_server


def record(msg: str = "hello %s", args: tuple[Any, ...] = ("world",), **fields: Any) -> logging.LogRecord:
    return logging.makeLogRecord(
        {
            "name": "normserve.test",
            "levelno": logging.WARNING,
            "levelname": "WARNING",
            "msg": msg,
            "args": args,
            **fields,
        }
    )


# ---- JsonFormatter ---------------------------------------------------------------------------------------


def test_a_line_has_time_level_logger_and_the_formatted_message_only() -> None:
    line = json.loads(logs.JsonFormatter().format(record(created=1_700_000_000.25, msecs=250.0)))
    assert line == {
        "ts": "2023-11-14T22:13:20.250Z",
        "level": "warning",
        "logger": "normserve.test",
        "msg": "hello world",
    }


@pytest.mark.parametrize(
    ("created", "ts"),
    [
        (1_700_000_000.001, "2023-11-14T22:13:20.001Z"),
        (1_700_000_000.999, "2023-11-14T22:13:20.999Z"),
        (1_700_000_001.0, "2023-11-14T22:13:21.000Z"),  # the next second: the cached text is redone
        (86_400.5, "1970-01-02T00:00:00.500Z"),
    ],
)
def test_the_timestamp_is_utc_to_the_millisecond_across_seconds(created: float, ts: str) -> None:
    formatter = logs.JsonFormatter()
    formatter.format(record(created=1_700_000_000.5, msecs=500.0))  # another second formatted first
    msecs = float(round((created - int(created)) * 1000))
    assert json.loads(formatter.format(record(created=created, msecs=msecs)))["ts"] == ts


def test_extra_fields_become_json_fields_numpy_and_other_values_included() -> None:
    extra = {
        "model": "layernorm",
        "parity_max_abs_diff": {"encoder": 1.5e-6},
        "load_seconds": np.float64(0.25),
        "rows": np.array([1, 2]),
        "path": Path("/models/layernorm.onnx"),
        "color_message": "\x1b[32mhello\x1b[0m",  # uvicorn's coloured copy: dropped
    }
    line = json.loads(logs.JsonFormatter().format(record(**extra)))
    assert {k: v for k, v in line.items() if k not in ("ts", "level", "logger", "msg")} == {
        "model": "layernorm",
        "parity_max_abs_diff": {"encoder": 1.5e-6},
        "load_seconds": 0.25,
        "rows": [1, 2],
        "path": "/models/layernorm.onnx",
    }


def test_an_exception_goes_in_its_own_field_and_the_line_stays_one_line() -> None:
    try:
        raise ValueError("bad value")
    except ValueError:
        exc_info = sys.exc_info()
    text = logs.JsonFormatter().format(record(exc_info=exc_info))
    assert "\n" not in text
    exc = json.loads(text)["exc"]
    assert exc.startswith("Traceback (most recent call last):") and exc.endswith("ValueError: bad value")


# ---- configure and uvicorn_log_config ----------------------------------------------------------------------


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize(("level", "access_lines"), [("debug", True), ("info", True), ("warning", False)])
def test_configure_sets_the_level_and_whether_request_lines_are_written(level: str, access_lines: bool) -> None:
    logs.configure(level)
    assert logging.getLogger("normserve").level == getattr(logging, level.upper())
    assert logs.access_enabled() is access_lines


@pytest.mark.usefixtures("restore_logging")
def test_configure_twice_leaves_one_json_handler_on_stderr_and_turns_uvicorns_access_log_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs.configure("info")
    logs.configure("info")
    for name in ("normserve", "uvicorn"):
        logger = logging.getLogger(name)
        (handler,) = logger.handlers
        assert isinstance(handler.formatter, logs.JsonFormatter) and logger.propagate is False
    access = logging.getLogger("uvicorn.access")
    assert (access.handlers, access.propagate, access.hasHandlers()) == ([], False, False)
    logs.access({"request_id": "abc", "status": 200})
    logging.getLogger("uvicorn.error").warning("Shutting down")  # uvicorn sets its own level: warning passes any
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(d["logger"], d["msg"], d.get("request_id")) for d in lines] == [
        ("normserve.access", "request", "abc"),
        ("uvicorn.error", "Shutting down", None),
    ]


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize("setup", ["configure", "dictConfig"])
def test_the_access_line_written_directly_is_the_line_logging_writes(
    setup: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if setup == "configure":
        logs.configure("info")
    else:
        logging.config.dictConfig(logs.uvicorn_log_config("info"))
    (handler,) = logging.getLogger("normserve").handlers
    assert isinstance(handler, logging.StreamHandler)
    stream = io.StringIO()
    handler.setStream(stream)
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0421)  # the same instant for both lines
    fields = {"request_id": "abc", "route": "/normalize", "status": 200, "model": None, "duration_ms": 0.25}
    logs.access(fields)  # directly
    logs.ACCESS.info("request", extra=fields)  # through logging
    direct, through_logging = stream.getvalue().splitlines()
    assert direct == through_logging
    assert json.loads(direct)["ts"] == "2023-11-14T22:13:20.042Z"


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize("setup", ["configure", "dictConfig"])
def test_the_opentelemetry_sdks_warnings_are_json_lines_too(setup: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Its exporter logs each retry while the collector is down: plain text between the JSON lines before."""
    if setup == "configure":
        logs.configure("info")
    else:
        logging.config.dictConfig(logs.uvicorn_log_config("info"))
        for handler in logging.getLogger("opentelemetry").handlers:
            assert isinstance(handler, logging.StreamHandler)
            handler.setStream(sys.stderr)  # dictConfig bound the stderr of before capsys
    exporter = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
    logging.getLogger(exporter).warning("Transient error %s encountered while exporting span batch", "503")
    (line,) = capsys.readouterr().err.splitlines()
    doc = json.loads(line)
    assert (doc["level"], doc["logger"]) == ("warning", exporter)
    assert doc["msg"] == "Transient error 503 encountered while exporting span batch"


@pytest.mark.usefixtures("restore_logging")
def test_an_added_handler_gets_the_access_line_as_a_record() -> None:
    logs.configure("info")
    with captured("normserve.access") as records:
        logs.access({"request_id": "abc"})
    assert [vars(r)["request_id"] for r in records] == ["abc"]


@pytest.mark.usefixtures("restore_logging")
def test_uvicorn_log_config_gives_json_at_the_level_and_no_uvicorn_access_log() -> None:
    logging.config.dictConfig(logs.uvicorn_log_config("debug"))
    for name in ("normserve", "uvicorn"):
        logger = logging.getLogger(name)
        (handler,) = logger.handlers
        assert isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr
        assert isinstance(handler.formatter, logs.JsonFormatter)
        assert (logger.level, logger.propagate) == (logging.DEBUG, False)
    access = logging.getLogger("uvicorn.access")
    assert (access.handlers, access.propagate) == ([], False)


# ---- over real servers ---------------------------------------------------------------------------------------


def test_start_up_lines_are_structured(logged: LoggedServer) -> None:
    lines = logged.lines()
    loaded = {(d["model"], d["version"]): d for d in lines if d["msg"].startswith("loaded model")}
    assert sorted(loaded) == [("encoder", "1"), ("encoder-preln", "1"), ("layernorm", "1")]
    (ready,) = [d for d in lines if d["msg"].startswith("ready")]
    assert sorted(ready["parity_max_abs_diff"]) == ["encoder-preln/1", "encoder/1", "layernorm/1"]
    for (name, version), d in loaded.items():
        sha256 = sha256sum_identity(MODELS / name / version)  # the version's identity, over every file
        assert (d["logger"], d["level"], d["sha256"]) == ("normserve.models", "info", sha256)
        found = re.fullmatch(
            rf"loaded model {name} version {version} \(sha256 {sha256[:12]}\.\.\.\) in (\d+\.\d{{3}}) s; "
            r"parity warm-up max abs diff (\d\.\d\de[-+]\d\d)",
            d["msg"],
        )
        assert found is not None, d["msg"]
        diff = ready["parity_max_abs_diff"][f"{name}/{version}"]
        assert float(found[1]) > 0 and found[2] == f"{diff:.2e}" and 0 <= diff < 1e-4


def test_every_line_is_a_json_object_with_time_level_logger_and_message(logged: LoggedServer) -> None:
    httpx.post(logged.base + "/normalize", json={"data": [[1.0, 2.0]]})
    httpx.get(logged.base + "/no/such/route")
    lines = logged.log.read_text().splitlines()
    assert len(lines) >= 5  # start-up, uvicorn's own lines and request lines
    for text in lines:
        line = json.loads(text)
        assert isinstance(line, dict) and {"ts", "level", "logger", "msg"} <= line.keys(), text
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["ts"]), text


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
    models = broken_copy(tmp_path, "no-manifest")
    reason = not_ready_reason(models, "no-manifest")
    with logged_server(tmp_path, "info", "uvicorn", models, wait="/v2/health/live") as server:
        deadline = time.monotonic() + 30
        while not [d for d in server.lines() if d["msg"].startswith("not ready")]:
            assert time.monotonic() < deadline, server.log.read_text()
            time.sleep(0.05)
    (line,) = [d for d in server.lines() if d["msg"].startswith("not ready")]
    assert (line["level"], line["logger"], line["reason"]) == ("error", "normserve", reason)
    assert line["msg"] == "not ready: " + reason.removeprefix("model check failed: ")


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("/a\u2028b", "/a\\u2028b"),
        ("/a\u2029b", "/a\\u2029b"),
        ("/a\x85b", "/a\\u0085b"),
        ("/nowhere\u202eexe.txt", "/nowhere\\u202eexe.txt"),
        ("/tag\U000e0041", "/tag\\udb40\\udc41"),
        ("/plain é ü", "/plain é ü"),
    ],
    ids=["line-separator", "paragraph-separator", "next-line", "bidi-override", "astral-tag", "printable-kept"],
)
def test_a_record_is_one_printable_line_that_parses_back_to_the_same_text(text: str, escaped: str) -> None:
    rec = logging.LogRecord("normserve.access", logging.INFO, __file__, 1, "request", None, None)
    rec.path = text
    line = logs.JsonFormatter().format(rec)
    assert line.splitlines() == [line] and line.isprintable()
    assert f'"path":"{escaped}"' in line and json.loads(line)["path"] == text
