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
    logsettings.update({"log_verbose_level": 0})  # nothing hidden
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


@pytest.mark.parametrize(
    ("start", "switches", "shown"),
    [
        (logging.WARNING, (1, False, True, True), ("debug", "warning", "error", "critical")),
        (logging.ERROR, (1, False, False, True), ("debug", "error", "critical")),
        (logging.CRITICAL, (1, False, False, False), ("debug", "critical")),
        (logging.INFO, (1, True, True, True), ("debug", "info", "warning", "error", "critical")),
    ],
    ids=["warning", "error", "critical", "info"],
)
def test_verbose_alone_turns_on_debug_and_leaves_the_other_switches_as_they_were(
    start: int, switches: tuple[int, bool, bool, bool], shown: tuple[str, ...]
) -> None:
    """As Triton's log_verbose_level: independent of log_info, so a server at warning needs no log_info to go verbose."""
    keys = ("log_verbose_level", "log_info", "log_warning", "log_error")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.levelname.lower())  # type: ignore[method-assign]
    logger = logging.getLogger("normserve")
    logger.addHandler(handler)
    try:
        logger.setLevel(start)
        settings = logsettings.update({"log_verbose_level": 1})
        assert tuple(settings[k] for k in keys) == switches
        assert logsettings.get() == settings
        child = logging.getLogger("normserve.lifecycle")
        for severity in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL):
            child.log(severity, "line")
        assert tuple(lines) == shown
        assert logging.getLogger(logsettings.ACCESS).isEnabledFor(logging.INFO) == switches[1]  # access lines: info
        quiet = logsettings.update({"log_verbose_level": 0})
        assert tuple(quiet[k] for k in keys) == (0, *switches[1:]) and logsettings.level() == start
        assert logging.getLogger(logsettings.ACCESS).isEnabledFor(logging.INFO) == switches[1]
    finally:
        logger.removeHandler(handler)
