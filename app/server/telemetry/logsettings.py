"""Triton's logging extension on normserve's one log level: the settings as Triton names them, per worker process.

Triton has independent switches (log_info, log_warning, log_error, log_verbose_level); normserve has
one level (NORMSERVE_LOG_LEVEL) for its loggers and uvicorn's. A level turns on its severity and
every one above it, so log_info, log_warning and log_error map to the lowest severity turned on
(none at all is critical), and a combination no level expresses (log_info on with log_warning off)
is refused. Verbose logging is independent of them, as in Triton, where a server at warning turns
verbose on with log_verbose_level alone: verbose level > 0 lowers the loggers to debug, and the
severities switched off between debug and that level are filtered out (HIDDEN). log_info off also
stops the per-request access lines, which are info. Lines are always JSON with an ISO 8601 `ts`:
log_format is ISO8601 and stays so; they go to stderr: log_file is "" and stays so.
"""

from __future__ import annotations

import logging
from typing import Any

from app.errors import InvalidInput, shown

LOGGERS = ("normserve", "uvicorn")
FORMAT = "ISO8601"
# Triton's switch for each severity, lowest first; a level turns on its own and all after it.
SWITCHES = (
    ("log_verbose_level", logging.DEBUG),
    ("log_info", logging.INFO),
    ("log_warning", logging.WARNING),
    ("log_error", logging.ERROR),
)
FIXED = {"log_file": "", "log_format": FORMAT}
ACCESS = "normserve.access"  # its lines bypass the handler's filters (logs.access): its level stops them instead


class Hidden(logging.Filter):
    """The severities switched off below verbose's debug: on the loggers' handlers, so it sees their children's
    records too (a logger's own filters do not)."""

    def __init__(self) -> None:
        super().__init__()
        self.levels: frozenset[int] = frozenset()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno not in self.levels


HIDDEN = Hidden()


def level() -> int:
    return logging.getLogger(LOGGERS[0]).getEffectiveLevel()


def _hide(levels: frozenset[int]) -> None:
    HIDDEN.levels = levels
    for name in LOGGERS:
        for handler in logging.getLogger(name).handlers:
            if levels:
                handler.addFilter(HIDDEN)
            else:
                handler.removeFilter(HIDDEN)
    logging.getLogger(ACCESS).setLevel(logging.WARNING if logging.INFO in levels else logging.NOTSET)


def get() -> dict[str, Any]:
    """Triton's JSON of the settings in force in this process."""
    current = level()
    settings: dict[str, Any] = {"log_file": ""}
    settings.update((name, current <= severity and severity not in HIDDEN.levels) for name, severity in SWITCHES)
    settings["log_verbose_level"] = 1 if current <= logging.DEBUG else 0
    settings["log_format"] = FORMAT
    return settings


def _checked(name: str, value: Any) -> Any:
    if name in FIXED:
        if value != FIXED[name]:
            raise InvalidInput(f"is {FIXED[name]!r} and cannot change (JSON lines, ISO 8601 times, on stderr)", name)
    elif name == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(f"expected an integer >= 0, got {shown(value)}", name)
    elif name in dict(SWITCHES):
        if not isinstance(value, bool):
            raise InvalidInput(f"expected true or false, got {shown(value)}", name)
    else:
        keys = ", ".join([*FIXED, *dict(SWITCHES)])
        raise InvalidInput(f"unknown log setting; expected one of {keys}", name)
    return value


def update(changes: dict[str, Any]) -> dict[str, Any]:
    """Apply Triton's POST body on top of the settings in force (all of it or none), then answer as get()."""
    merged = get()
    for name, value in changes.items():
        if value is not None:  # null leaves a setting as it is, as tritonclient's None does
            merged[name] = _checked(name, value)
    severities = SWITCHES[1:]  # verbose is not one of the level's: it is independent of them
    on = [bool(merged[name]) for name, _ in severities]
    lowest = on.index(True) if True in on else len(on)
    if not all(on[lowest:]):
        shown_on = {name: merged[name] for name, _ in SWITCHES}
        raise InvalidInput(f"one log level turns on its severity and all above it; {shown_on} is no level", "logging")
    new = severities[lowest][1] if lowest < len(severities) else logging.CRITICAL
    verbose = merged["log_verbose_level"] > 0
    _hide(frozenset(s for _, s in severities if s < new) if verbose else frozenset())
    for name in LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else new)
    return get()
