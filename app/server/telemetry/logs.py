"""Structured logs: one JSON object per line on stderr, for normserve's and uvicorn's loggers alike."""

from __future__ import annotations

import logging
import sys
import time
from contextlib import nullcontext
from typing import Any

import orjson

ACCESS = logging.getLogger("normserve.access")

# LogRecord's own attributes: anything else on a record came from `extra=` and becomes a JSON field.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
_SKIP = _RECORD_ATTRS | {"color_message"}  # uvicorn's ANSI-coloured copy of the message


_second: tuple[int, str] = (-1, "")  # strftime once per second, not once per line


def _timestamp(created: float, msecs: float) -> str:
    global _second
    second, text = _second
    if int(created) != second:
        second, text = int(created), time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
        _second = (second, text)
    return f"{text}.{int(msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    """{"ts", "level", "logger", "msg", ...extra fields, "exc"}; never the message's arguments on their own."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _timestamp(record.created, record.msecs),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update((k, v) for k, v in record.__dict__.items() if k not in _SKIP)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return _dumps(doc)


def _dumps(doc: dict[str, Any]) -> str:
    """One record as one line of JSON: through the formatter and on access()'s direct path alike."""
    return one_line(orjson.dumps(doc, default=str, option=orjson.OPT_SERIALIZE_NUMPY).decode())


def one_line(line: str) -> str:
    """A JSON record with every character that is not printable escaped as \\uXXXX.

    orjson escapes only what JSON requires (U+0000..U+001F); U+2028 and U+2029 (line separators to
    str.splitlines, JavaScript and many log viewers), U+0085, bidi overrides (U+202E) and zero-width
    characters from a client's path would pass raw, and one record would read as two lines or as
    other text. Escaped, the JSON still parses to the client's exact characters."""
    if line.isprintable():  # C speed, the usual case
        return line
    return "".join(ch if ch.isprintable() else _escaped(ch) for ch in line)


def _escaped(ch: str) -> str:
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # outside the BMP: JSON's surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def _level(name: str) -> str:
    return name.upper()


# The OpenTelemetry SDK's loggers (its exporter's retries when the collector is down): without a handler of
# their own, logging's last resort wrote them to stderr as plain text between the JSON lines.
OTEL = "opentelemetry"


def uvicorn_log_config(level: str) -> dict[str, Any]:
    """uvicorn's `log_config`: JSON from its first line; its access log off, as normserve.access replaces it."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "app.server.telemetry.logs.JsonFormatter"}},
        "handlers": {"stderr": handler},
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": _level(level), "propagate": False},
            "uvicorn.access": {"handlers": [], "propagate": False},
            "normserve": {"handlers": ["stderr"], "level": _level(level), "propagate": False},
            OTEL: {"handlers": ["stderr"], "level": _level(level), "propagate": False},
        },
    }


def configure(level: str) -> None:
    """JSON on stderr for normserve.*, uvicorn.* and opentelemetry.*, at NORMSERVE_LOG_LEVEL; idempotent.

    Runs in each worker's lifespan, so `uvicorn app.main:app` gets JSON too from start-up on;
    `normserve serve` already hands uvicorn the same setup (uvicorn_log_config) before it logs anything.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("normserve", "uvicorn", OTEL):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False
    for name in ("normserve", OTEL):
        logging.getLogger(name).setLevel(_level(level))
    # No handler and no propagation: uvicorn sees hasHandlers() false and does not even build its access lines.
    access = logging.getLogger("uvicorn.access")
    access.handlers = []
    access.propagate = False


def access_enabled() -> bool:
    return ACCESS.isEnabledFor(logging.INFO)


def access(fields: dict[str, Any]) -> None:
    """The one line per request: fields name the request, never its body or query.

    With the handler configure() sets, the line is written to its stream directly, the same bytes as
    through logging: the LogRecord, its extra= checks and the formatter's scan of the record cost
    ~35 us of the 0.1 ms a small request's CPU came to (in process, scripts/server_cpu.py). Any
    other set-up (a handler a test or an embedder added) gets the line through logging, as before."""
    handler = _direct_handler()
    if handler is None:
        ACCESS.info("request", extra=fields)
        return
    created = time.time()
    doc = {"ts": _timestamp(created, (created - int(created)) * 1000), **_ACCESS_HEAD, **fields}
    line = _dumps(doc) + "\n"
    try:
        with handler.lock or nullcontext():
            handler.stream.write(line)
            handler.stream.flush()
    except (OSError, ValueError):  # a closed or broken stderr: logging drops the line too, never the request
        pass


_ACCESS_HEAD = {"level": "info", "logger": ACCESS.name, "msg": "request"}


def _direct_handler() -> logging.StreamHandler[Any] | None:
    """configure()'s one JSON handler on "normserve", if the access line would reach it and nothing else."""
    if ACCESS.handlers or ACCESS.filters or not ACCESS.propagate or not ACCESS.isEnabledFor(logging.INFO):
        return None
    parent = ACCESS.parent
    if parent is None or parent.name != "normserve" or parent.propagate or parent.filters:
        return None
    handlers = parent.handlers
    if len(handlers) != 1:
        return None
    handler = handlers[0]
    if type(handler) is not logging.StreamHandler or type(handler.formatter) is not JsonFormatter:
        return None
    return None if handler.filters or handler.level > logging.INFO else handler
