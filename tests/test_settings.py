"""app/settings.py: NORMSERVE_* variables parsed into one typed, frozen object; bad values refused by name."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from app.settings import Settings
from tests.live_server import ROOT

PREFIX = "NORMSERVE_"
TOKEN_REFUSED = (
    "Value error, NORMSERVE_ADMIN_TOKEN must be printable ASCII without spaces or control characters inside "
    "(a bearer token); the value set is not"
)


@pytest.fixture(autouse=True)
def no_normserve_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees only the NORMSERVE_* variables it sets itself."""
    for name in list(os.environ):
        if name.upper().startswith(PREFIX):
            monkeypatch.delenv(name)


def _readme_defaults() -> dict[str, str]:
    """README's Settings table: {variable: default}, with `A` / `B` rows split into two."""
    section = (ROOT / "README.md").read_text().split("\n## Settings\n")[1].split("\n## ")[0]
    defaults: dict[str, str] = {}
    for line in section.splitlines():
        if line.startswith(f"| `{PREFIX}"):
            names, values = (cell.strip() for cell in line.strip("|").split("|")[:2])
            for name, value in zip(names.split(" / "), values.split(" / "), strict=True):
                defaults[name.strip("`")] = value.strip("`")
    return defaults


@pytest.mark.parametrize(
    ("variable", "value", "field", "expected"),
    [
        ("NORMSERVE_MODEL_DIR", "/srv/models", "model_dir", Path("/srv/models")),
        ("NORMSERVE_HOST", "0.0.0.0", "host", "0.0.0.0"),
        ("NORMSERVE_PORT", "9001", "port", 9001),
        ("NORMSERVE_PORT", "0", "port", 0),
        ("NORMSERVE_WORKERS", "4", "workers", 4),
        ("NORMSERVE_GRPC_PORT", "0", "grpc_port", 0),
        ("NORMSERVE_GRPC_PORT", "50051", "grpc_port", 50051),
        ("NORMSERVE_MAX_BODY_BYTES", "1024", "max_body_bytes", 1024),
        ("NORMSERVE_MAX_ELEMENTS", "10", "max_elements", 10),
        ("NORMSERVE_MAX_DEPTH", "3", "max_depth", 3),
        ("NORMSERVE_MAX_IN_FLIGHT", "2", "max_in_flight", 2),
        ("NORMSERVE_MAX_INFLIGHT_BYTES", "1048576", "max_inflight_bytes", 1048576),
        ("NORMSERVE_HEADER_TIMEOUT_S", "0.5", "header_timeout_s", 0.5),
        ("NORMSERVE_MAX_CONNECTIONS", "50", "max_connections", 50),
        ("NORMSERVE_REQUEST_TIMEOUT_S", "0.25", "request_timeout_s", 0.25),
        ("NORMSERVE_BODY_TIMEOUT_S", "0.5", "body_timeout_s", 0.5),
        ("NORMSERVE_DRAIN_TIMEOUT_S", "0", "drain_timeout_s", 0.0),
        ("NORMSERVE_INTRA_OP_THREADS", "0", "intra_op_threads", 0),
        ("NORMSERVE_BATCH_MAX_SIZE", "1", "batch_max_size", 1),
        ("NORMSERVE_BATCH_DELAY_US", "0", "batch_delay_us", 0),
        ("NORMSERVE_BATCH_MAX_SEQ_LEN", "128", "batch_max_seq_len", 128),
        ("NORMSERVE_LOG_LEVEL", "warning", "log_level", "warning"),
        ("NORMSERVE_VALIDATE_ATOL", "1e-6", "validate_atol", 1e-6),
        ("NORMSERVE_MONITOR_SAMPLE", "0.25", "monitor_sample", 0.25),
        ("NORMSERVE_MONITOR_SAMPLE", "0", "monitor_sample", 0.0),
        ("NORMSERVE_MONITOR_WINDOW_S", "5", "monitor_window_s", 5.0),
        ("normserve_workers", "3", "workers", 3),  # names are case-insensitive
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_each_variable_is_parsed_into_its_typed_field(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, field: str, expected: Any
) -> None:
    monkeypatch.setenv(variable, value)
    got = getattr(Settings(), field)
    assert (got, type(got)) == (expected, type(expected))


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("NORMSERVE_PORT", "not-a-port", "Input should be a valid integer, unable to parse string as an integer"),
        ("NORMSERVE_PORT", "65536", "Input should be less than or equal to 65535"),
        ("NORMSERVE_PORT", "-1", "Input should be greater than or equal to 0"),
        ("NORMSERVE_WORKERS", "0", "Input should be greater than or equal to 1"),
        ("NORMSERVE_GRPC_PORT", "65536", "Input should be less than or equal to 65535"),
        ("NORMSERVE_MAX_BODY_BYTES", "1.5", "Input should be a valid integer, unable to parse string as an integer"),
        ("NORMSERVE_MAX_ELEMENTS", "0", "Input should be greater than or equal to 1"),
        ("NORMSERVE_MAX_DEPTH", "0", "Input should be greater than or equal to 1"),
        ("NORMSERVE_MAX_IN_FLIGHT", "0", "Input should be greater than or equal to 1"),
        ("NORMSERVE_MAX_INFLIGHT_BYTES", "1000", "Input should be greater than or equal to 1024"),
        ("NORMSERVE_HEADER_TIMEOUT_S", "0", "Input should be greater than 0"),
        ("NORMSERVE_MAX_CONNECTIONS", "0", "Input should be greater than or equal to 1"),
        ("NORMSERVE_REQUEST_TIMEOUT_S", "0", "Input should be greater than 0"),
        ("NORMSERVE_BODY_TIMEOUT_S", "0", "Input should be greater than 0"),
        ("NORMSERVE_DRAIN_TIMEOUT_S", "-0.5", "Input should be greater than or equal to 0"),
        ("NORMSERVE_INTRA_OP_THREADS", "-1", "Input should be greater than or equal to 0"),
        ("NORMSERVE_BATCH_MAX_SIZE", "0", "Input should be greater than or equal to 1"),
        ("NORMSERVE_BATCH_DELAY_US", "-1", "Input should be greater than or equal to 0"),
        ("NORMSERVE_BATCH_MAX_SEQ_LEN", "0", "Input should be greater than or equal to 1"),
        ("NORMSERVE_VALIDATE_ATOL", "0", "Input should be greater than 0"),
        ("NORMSERVE_VALIDATE_ATOL", "tight", "Input should be a valid number, unable to parse string as a number"),
        *(
            (("NORMSERVE_ADMIN_TOKEN", token, TOKEN_REFUSED))
            for token in ("two words", "tök", "a\x07b", "a\u202eb", "s3cret\xa0", "\x85s3cret")
        ),
        ("NORMSERVE_MONITOR_SAMPLE", "1.5", "Input should be less than or equal to 1"),
        ("NORMSERVE_MONITOR_SAMPLE", "-0.1", "Input should be greater than or equal to 0"),
        ("NORMSERVE_MONITOR_WINDOW_S", "0", "Input should be greater than 0"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as e:
        Settings()
    assert [(err["loc"], err["msg"]) for err in e.value.errors()] == [((variable[len(PREFIX) :].lower(),), message)]


@pytest.mark.parametrize("value", ["s3cret\n", "  s3cret  ", "\ts3cret\r\n"], ids=["secret-file", "spaces", "crlf"])
def test_the_admin_token_is_stripped_of_surrounding_whitespace(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("NORMSERVE_ADMIN_TOKEN", value)
    assert Settings().admin_token == "s3cret"


def test_a_refused_admin_token_is_never_quoted_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NORMSERVE_ADMIN_TOKEN", "top secret")
    with pytest.raises(ValidationError) as e:
        Settings()
    assert "top secret" not in str(e.value) and TOKEN_REFUSED in str(e.value)


def test_constructor_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NORMSERVE_PORT", "9001")
    monkeypatch.setenv("NORMSERVE_MODEL_DIR", "/from/env")
    settings = Settings(model_dir=Path("/from/code"))
    assert (settings.model_dir, settings.port) == (Path("/from/code"), 9001)


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(ValidationError) as e:
        settings.port = 1  # type: ignore[misc]
    assert [(err["loc"], err["msg"]) for err in e.value.errors()] == [(("port",), "Instance is frozen")]
    assert settings.port == 8000


def test_readme_lists_every_setting_with_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    readme = _readme_defaults()
    assert sorted(readme) == sorted(PREFIX + field.upper() for field in Settings.model_fields)
    defaults = Settings()
    for variable, value in readme.items():
        monkeypatch.setenv(variable, value)
    assert Settings() == defaults  # each documented default, read back through its variable, is the default
