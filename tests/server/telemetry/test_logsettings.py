"""app/server/telemetry/logsettings.py: Triton's log switches mapped on to normserve's one log level, both ways."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from app.errors import InvalidInput
from app.server.telemetry import logsettings


@pytest.fixture(autouse=True)
def restore_levels() -> Iterator[None]:
    saved = {name: logging.getLogger(name).level for name in logsettings.LOGGERS}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize(
    ("level", "switches"),
    [
        (logging.DEBUG, (1, True, True, True)),
        (logging.INFO, (0, True, True, True)),
        (logging.WARNING, (0, False, True, True)),
        (logging.ERROR, (0, False, False, True)),
        (logging.CRITICAL, (0, False, False, False)),
    ],
    ids=["debug", "info", "warning", "error", "critical"],
)
def test_each_level_reads_as_triton_switches_and_back(level: int, switches: tuple[int, bool, bool, bool]) -> None:
    keys = ("log_verbose_level", "log_info", "log_warning", "log_error")
    logging.getLogger("normserve").setLevel(logging.INFO)
    settings = logsettings.update(dict(zip(keys, switches, strict=True)))
    assert tuple(settings[k] for k in keys) == switches
    assert settings["log_format"] == "ISO8601" and settings["log_file"] == ""
    assert all(logging.getLogger(name).level == level for name in logsettings.LOGGERS)


@pytest.mark.parametrize(
    ("changes", "level"),
    [
        ({"log_info": False}, logging.WARNING),
        ({"log_verbose_level": 3}, logging.DEBUG),
        ({"log_info": None}, logging.INFO),  # null leaves it as it is
        ({}, logging.INFO),
    ],
)
def test_a_partial_update_applies_on_top_of_the_level_in_force(changes: dict[str, Any], level: int) -> None:
    logging.getLogger("normserve").setLevel(logging.INFO)
    logsettings.update(changes)
    assert logsettings.level() == level


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"log_error": False},
            "logging: one log level turns on its severity and all above it; {'log_verbose_level': 1, 'log_info': True, 'log_warning': True, 'log_error': False} is no level",
        ),
        ({"log_verbose_level": True}, "log_verbose_level: expected an integer >= 0, got True"),
        ({"log_warning": 1}, "log_warning: expected true or false, got 1"),
        ({"log_file": "/tmp/x.log"}, "log_file: is '' and cannot change (JSON lines, ISO 8601 times, on stderr)"),
        (
            {"log_level": "debug"},
            "log_level: unknown log setting; expected one of log_file, log_format, log_verbose_level, log_info, log_warning, log_error",
        ),
    ],
)
def test_what_no_level_expresses_is_refused_and_changes_nothing(changes: dict[str, Any], message: str) -> None:
    logging.getLogger("normserve").setLevel(logging.INFO)
    with pytest.raises(InvalidInput) as e:
        logsettings.update({"log_verbose_level": 1, **changes})
    assert e.value.message == message and logsettings.level() == logging.INFO
