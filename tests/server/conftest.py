"""Fixtures of the server tests: a logged server shared by the log and middleware tests, uvicorn's Server with its
signal handlers, and the hygiene of this process's signal handlers and loggers."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator

import pytest
import uvicorn

from app.server.drain import DRAIN_SIGNALS
from tests.server.logged_server import LoggedServer, logged_server


@pytest.fixture(scope="session")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedServer]:
    """`normserve serve` at log level info with its output in a file: the request lines and start-up lines."""
    with logged_server(tmp_path_factory.mktemp("logs"), "info") as server:
        yield server


@pytest.fixture
def signal_handlers() -> Iterator[None]:
    """Puts back this process's SIGTERM and SIGINT handlers, whatever the test installed."""
    saved = {sig: signal.getsignal(sig) for sig in DRAIN_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@pytest.fixture
def uvicorn_server(signal_handlers: None) -> Iterator[uvicorn.Server]:
    """uvicorn's Server, its handle_exit installed for SIGTERM and SIGINT as uvicorn's capture_signals does (before
    the lifespan starts)."""
    server = uvicorn.Server(uvicorn.Config("app.main:app"))
    for sig in DRAIN_SIGNALS:
        signal.signal(sig, server.handle_exit)
    yield server


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The lifespan, configure() and dictConfig change this process's normserve and uvicorn loggers: put them back
    afterwards."""
    loggers = [logging.getLogger(name) for name in ("normserve", "uvicorn", "uvicorn.access", "opentelemetry")]
    saved = [(list(lg.handlers), lg.level, lg.propagate, lg.disabled) for lg in loggers]
    try:
        yield
    finally:
        for lg, (handlers, level, propagate, disabled) in zip(loggers, saved, strict=True):
            lg.handlers, lg.propagate, lg.disabled = handlers, propagate, disabled
            lg.setLevel(level)
