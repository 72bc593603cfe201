"""Triton's trace extension settings: which requests get a trace, changed at run time, per worker process.

trace_level OFF or TIMESTAMPS (Triton's TENSORS would put tensor values in spans: never), trace_rate N
(one inference request in N), trace_count (inference traces left, -1 = no limit; at 0 inference tracing
stops until it is set again).
The server-wide values apply to every model; a model's own values override them one by one, and a
null value clears a model's override (or puts a server-wide value back to its start-up default), as
in Triton. A model that sets its own rate or count has its own counter. Every value is a string on
the wire (`"trace_rate": "1"`), trace_level a list of strings, as Triton and tritonclient send them.

This only narrows what OpenTelemetry's sampler (OTEL_TRACES_SAMPLER) then decides; with no exporter
configured TIMESTAMPS is refused, as the spans would go nowhere.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, replace
from typing import Any

from app.errors import InvalidInput, shown

OFF, TIMESTAMPS = "OFF", "TIMESTAMPS"
UNLIMITED = -1
MODE = "opentelemetry"  # Triton's trace_mode: spans go out over OTLP, not into a trace_file
# Triton's file-mode settings, reported as Triton reports them in OpenTelemetry mode; only their value is accepted.
FIXED = {"trace_file": "", "log_frequency": "0", "trace_mode": MODE}
NO_EXPORTER = "OTEL_EXPORTER_OTLP_ENDPOINT is not set (or OTEL_SDK_DISABLED is true)"
KEYS = ("trace_level", "trace_rate", "trace_count", *FIXED)
_INTEGER = re.compile(r"[+-]?[0-9]+")


@dataclass
class Scope:
    """Server-wide values (all set) or one model's overrides (None = the server-wide value)."""

    level: str | None = None
    rate: int | None = None
    count: int | None = None
    seen: int = 0  # requests counted against this scope's rate, when it sets one


def _level(value: Any) -> str:
    values = value if isinstance(value, list) else [value]
    if len(values) != 1 or values[0] not in (OFF, TIMESTAMPS):
        expected = f"expected [{OFF!r}] or [{TIMESTAMPS!r}] (TENSORS is not supported)"
        raise InvalidInput(f"{expected}, got {shown(value)}", "trace_level")
    return str(values[0])


def _integer(key: str, value: Any, least: int) -> int:
    text = value[0] if isinstance(value, list) and len(value) == 1 else value
    # A string of ASCII digits: int() alone also reads " 5 ", "1_0" and fullwidth digits.
    digits = isinstance(text, str) and _INTEGER.fullmatch(text)
    try:
        number = int(text) if digits or (isinstance(text, int) and not isinstance(text, bool)) else None
    except ValueError:  # past int()'s 4,300 digits
        number = None
    if number is None or number < least:
        raise InvalidInput(f"expected an integer >= {least} (as a string), got {shown(value)}", key)
    return number


class TraceSettings:
    """The settings of one worker process; `sample(model)` says whether a request of that model is traced."""

    def __init__(self, exporting: bool) -> None:
        self.exporting = exporting
        self.default = Scope(TIMESTAMPS if exporting else OFF, 1, UNLIMITED)
        self._global = replace(self.default)
        self._models: dict[str, Scope] = {}
        self._lock = threading.Lock()  # the loop samples; the gRPC and HTTP routes update: one lock for both
        self.any_on = self._global.level == TIMESTAMPS  # read per request without the lock: a plain bool

    def get(self, model: str | None = None) -> dict[str, Any]:
        """Triton's JSON of the values in force, for the server or for one model."""
        with self._lock:
            own = self._models.get(model or "", Scope())
            level = own.level or self._global.level
            rate = self._global.rate if own.rate is None else own.rate
            count = self._global.count if own.count is None else own.count
        return {"trace_level": [level], "trace_rate": str(rate), "trace_count": str(count), **FIXED}

    def update(self, changes: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        """Apply Triton's POST body (all of it or none: a bad value changes nothing), then answer as get()."""
        parsed = self._parse(changes)
        with self._lock:
            scope = self._models.setdefault(model, Scope()) if model else self._global
            for name, value in parsed.items():
                default = None if model else getattr(self.default, name)
                setattr(scope, name, default if value is None else value)
                if name == "rate":
                    scope.seen = 0
            self.any_on = any(s.level == TIMESTAMPS for s in (self._global, *self._models.values()))
        return self.get(model)

    def _parse(self, changes: dict[str, Any]) -> dict[str, Any]:
        parsed: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in KEYS:
                raise InvalidInput(f"unknown trace setting; expected one of {', '.join(KEYS)}", key)
            if key in FIXED:
                if value is not None and value != FIXED[key] and value != [FIXED[key]]:
                    raise InvalidInput(f"is {FIXED[key]!r} in {MODE} trace mode and cannot change", key)
            elif value is None:
                parsed[key.removeprefix("trace_")] = None
            elif key == "trace_level":
                parsed["level"] = _level(value)
                if parsed["level"] == TIMESTAMPS and not self.exporting:
                    raise InvalidInput(f"{TIMESTAMPS} needs an OTLP endpoint: {NO_EXPORTER}", key)
            else:
                least = 1 if key == "trace_rate" else UNLIMITED
                parsed[key.removeprefix("trace_")] = _integer(key, value, least)
        return parsed

    def sample(self, model: str | None, inference: bool = True) -> bool:
        """Whether this request is traced: level on, its turn in the rate, and a trace left in the count.

        As in Triton, rate and count are of inference requests; any other request (health, metadata, these
        settings) is traced whenever the server-wide level is TIMESTAMPS, and counts against neither."""
        if not inference:
            return self._global.level == TIMESTAMPS
        with self._lock:
            own = self._models.get(model or "")
            level = (own.level if own is not None else None) or self._global.level
            if level != TIMESTAMPS:
                return False
            rated = own if own is not None and own.rate is not None else self._global
            counted = own if own is not None and own.count is not None else self._global
            assert rated.rate is not None and counted.count is not None  # the server-wide scope sets both
            if counted.count == 0:
                return False
            rated.seen += 1
            if (rated.seen - 1) % rated.rate:
                return False
            if counted.count > 0:
                counted.count -= 1
            return True
