"""Triton's logging extension on normserve's one log level: the settings as Triton names them, per worker process.

Triton has independent switches (log_info, log_warning, log_error, log_verbose_level); normserve has
one level (NORMSERVE_LOG_LEVEL) for its loggers and uvicorn's. A level turns on its severity and
every one above it, so the switches map to the lowest severity turned on: verbose level > 0 is
debug, then info, warning, error, and none at all is critical. A combination no level expresses
(log_info on with log_warning off) is refused. log_info off also stops the per-request access lines,
which are info. Lines are always JSON with an ISO 8601 `ts`: log_format is ISO8601 and stays so;
they go to stderr: log_file is "" and stays so.
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


def level() -> int:
    return logging.getLogger(LOGGERS[0]).getEffectiveLevel()


def get() -> dict[str, Any]:
    """Triton's JSON of the settings in force in this process."""
    current = level()
    settings: dict[str, Any] = {"log_file": ""}
    settings.update((name, current <= severity) for name, severity in SWITCHES)
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
    on = [bool(merged[name]) for name, _ in SWITCHES]
    lowest = on.index(True) if True in on else len(on)
    if not all(on[lowest:]):
        shown_on = {name: merged[name] for name, _ in SWITCHES}
        raise InvalidInput(f"one log level turns on its severity and all above it; {shown_on} is no level", "logging")
    new = SWITCHES[lowest][1] if lowest < len(SWITCHES) else logging.CRITICAL
    for name in LOGGERS:
        logging.getLogger(name).setLevel(new)
    return get()
