"""Capturing a logger's records in process: normserve's loggers do not propagate, so caplog does not see them."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def captured(name: str, level: int = logging.INFO) -> Iterator[list[logging.LogRecord]]:
    """The records `name` logs at `level` and above inside the block; the logger's level is put back after."""
    logger, handler = logging.getLogger(name), Records()
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)
