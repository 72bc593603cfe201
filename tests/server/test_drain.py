"""app/server/drain.py, unit by unit: Drain wraps the server's signal handlers, drains on the first signal, then
hands the signal on. The handlers are installed with signal.signal on the main thread, the signals are real
(os.kill of this process), and the server's handler is uvicorn's own `Server.handle_exit` on a server that is
never started. The drain of a real server under load is tests/suites/test_drain.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from types import FrameType
from typing import Any, TypeVar

import anyio
import pytest
import uvicorn
from prometheus_client import REGISTRY

from app.errors import NotReady
from app.server.admission import Admission
from app.server.drain import DRAIN_SIGNALS, Drain
from tests.polling import run, until

T = TypeVar("T")
SIGNALS = pytest.mark.parametrize("sig", DRAIN_SIGNALS, ids=lambda s: signal.Signals(s).name)


def busy(in_flight: int = 1) -> Admission:
    """A ready admission with requests in flight."""
    admission = Admission(8)
    admission.ready = True
    for _ in range(in_flight):
        admission.enter()
    return admission


def test_install_wraps_the_servers_handlers_and_uninstall_puts_them_back(uvicorn_server: uvicorn.Server) -> None:
    drain = Drain(busy(0), 5.0)

    async def scenario() -> None:
        assert drain.install() is True
        for sig in DRAIN_SIGNALS:
            handler = signal.getsignal(sig)
            assert handler != uvicorn_server.handle_exit and getattr(handler, "__self__", None) is drain
        drain.uninstall()

    run(scenario())
    assert all(signal.getsignal(sig) == uvicorn_server.handle_exit for sig in DRAIN_SIGNALS)


@pytest.mark.parametrize(
    "handler",
    [signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler],
    ids=["SIG_DFL", "SIG_IGN", "KeyboardInterrupt"],
)
def test_install_without_a_server_handler_wraps_nothing(signal_handlers: None, handler: Any) -> None:
    for sig in DRAIN_SIGNALS:
        signal.signal(sig, handler)
    drain = Drain(busy(0), 5.0)

    async def install() -> bool:
        return drain.install()

    assert run(install()) is False
    assert all(signal.getsignal(sig) == handler for sig in DRAIN_SIGNALS)


def test_install_off_the_main_thread_wraps_nothing(uvicorn_server: uvicorn.Server) -> None:
    drain = Drain(busy(0), 5.0)
    installed: list[bool] = []
    thread = threading.Thread(target=lambda: installed.append(drain.install()))
    thread.start()
    thread.join()
    assert installed == [False]
    assert all(signal.getsignal(sig) == uvicorn_server.handle_exit for sig in DRAIN_SIGNALS)


def test_uninstall_leaves_a_handler_installed_after_the_drain_alone(uvicorn_server: uvicorn.Server) -> None:
    drain = Drain(busy(0), 5.0)

    async def scenario() -> None:
        assert drain.install()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # someone else's handler since
        drain.uninstall()

    run(scenario())
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) == uvicorn_server.handle_exit


@SIGNALS
def test_the_first_signal_drains_and_calls_the_servers_handler_once_idle(
    uvicorn_server: uvicorn.Server, sig: int
) -> None:
    admission = busy(1)
    drain = Drain(admission, 5.0)
    assert REGISTRY.get_sample_value("normserve_ready") == 1

    async def scenario() -> float:
        assert drain.install()
        os.kill(os.getpid(), sig)
        await until(lambda: REGISTRY.get_sample_value("normserve_ready") == 0, "the drain's start on the loop")
        # Draining: not ready and refusing new work at once, while the server itself keeps running.
        assert admission.draining and not admission.accepting and not uvicorn_server.should_exit
        assert REGISTRY.get_sample_value("normserve_ready") == 0  # published on the loop, after the handler
        with pytest.raises(NotReady) as e:
            admission.enter()
        assert e.value.message == "server is shutting down; retry on another replica"
        idle_at = time.monotonic()
        admission.leave()  # the last request in flight ends
        await until(lambda: uvicorn_server.should_exit)
        drain.uninstall()
        return time.monotonic() - idle_at

    assert run(scenario()) < 1.0  # handed on once idle, not at the drain timeout
    assert drain.signalled_at is not None and uvicorn_server.force_exit is False


def test_a_drain_past_its_timeout_abandons_the_waiting_requests_then_calls_the_servers_handler(
    uvicorn_server: uvicorn.Server,
) -> None:
    admission = busy(1)  # never leaves
    drain = Drain(admission, 0.3)

    async def waiting_request(scope: anyio.CancelScope) -> None:
        with scope:
            await asyncio.sleep(10)

    async def scenario() -> tuple[float, bool]:
        scope = anyio.CancelScope()
        admission.abandonable.add(scope)
        request = asyncio.ensure_future(waiting_request(scope))
        assert drain.install()
        t0 = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        await until(lambda: uvicorn_server.should_exit)
        elapsed = time.monotonic() - t0
        await asyncio.wait_for(request, 1.0)
        drain.uninstall()
        return elapsed, scope.cancelled_caught

    elapsed, abandoned = run(scenario())
    assert 0.3 <= elapsed < 2.0 and abandoned
    assert uvicorn_server.config.timeout_graceful_shutdown == 0.5  # the least it leaves uvicorn's own shutdown


@pytest.mark.parametrize(
    ("configured", "low", "high"),
    [(None, 4.0, 5.0), (60.0, 4.0, 5.0), (1.0, 1.0, 1.0)],
    ids=["unbounded", "longer", "shorter"],
)
def test_the_servers_shutdown_wait_is_bounded_by_what_is_left_of_the_drain_timeout(
    uvicorn_server: uvicorn.Server, configured: float | None, low: float, high: float
) -> None:
    uvicorn_server.config.timeout_graceful_shutdown = configured
    admission = busy(1)
    drain = Drain(admission, 5.0)

    async def scenario() -> None:
        assert drain.install()
        os.kill(os.getpid(), signal.SIGTERM)
        await until(lambda: REGISTRY.get_sample_value("normserve_ready") == 0, "the drain's start on the loop")
        admission.leave()  # the last request ends once the drain waits for it
        await until(lambda: uvicorn_server.should_exit)
        drain.uninstall()

    run(scenario())
    bound = uvicorn_server.config.timeout_graceful_shutdown
    assert bound is not None and low <= bound <= high


@SIGNALS
def test_a_second_signal_goes_straight_to_the_servers_handler(signal_handlers: None, sig: int) -> None:
    calls: list[tuple[int, bool]] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        calls.append((signum, frame is not None))

    for s in DRAIN_SIGNALS:
        signal.signal(s, handler)
    admission = busy(1)
    drain = Drain(admission, 5.0)

    async def scenario() -> list[tuple[int, bool]]:
        assert drain.install()
        os.kill(os.getpid(), sig)
        await until(lambda: REGISTRY.get_sample_value("normserve_ready") == 0, "the drain's start on the loop")
        assert calls == [] and admission.draining  # the first one only drains
        os.kill(os.getpid(), sig)
        await until(lambda: calls, "the second signal handed on")
        second = list(calls)  # called from the signal itself (with its frame), while the drain still waits
        admission.leave()
        await until(lambda: len(calls) == 2)
        drain.uninstall()
        return second

    assert run(scenario()) == [(sig, True)]
    assert calls == [(sig, True), (sig, False)]  # then the drain hands on the first one as it ends
