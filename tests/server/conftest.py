"""Fixtures of the server tests: a logged server shared by the log and middleware tests, and signal hygiene."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

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
