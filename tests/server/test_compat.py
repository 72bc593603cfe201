"""app/server/compat.py: each reach into uvicorn's internals, on the uvicorn installed. These fail first when a
new release moves what the reach reads (pyproject.toml bounds uvicorn for that reason)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from app.server import compat
from app.server.drain import DRAIN_SIGNALS
from app.server.http import heads


@pytest.fixture
def captured(signal_handlers: None) -> Iterator[uvicorn.Server]:
    """A uvicorn Server (never started) with the signal handlers its own capture_signals installs."""
    server = uvicorn.Server(uvicorn.Config("app.main:app"))
    with server.capture_signals():
        yield server


def test_the_server_is_found_behind_the_signal_handler_uvicorn_installs(captured: uvicorn.Server) -> None:
    handlers = [signal.getsignal(sig) for sig in DRAIN_SIGNALS]
    assert [compat.signal_server(h) for h in handlers] == [captured, captured]
    assert compat.server_config([signal.SIG_DFL, *handlers]) is captured.config


@pytest.mark.parametrize("handler", [signal.SIG_DFL, signal.default_int_handler, print], ids=["dfl", "int", "other"])
def test_no_server_is_found_behind_another_handler(handler: Any) -> None:
    assert compat.signal_server(handler) is None
    assert compat.server_config([handler]) is None


@pytest.mark.parametrize(
    ("configured", "remaining", "bound"),
    [(None, 2.5, 2.5), (10, 2.5, 2.5), (1, 2.5, 1)],
    ids=["unbounded", "longer", "shorter-kept"],
)
def test_the_graceful_shutdown_is_bounded_by_what_is_left(
    captured: uvicorn.Server, configured: int | None, remaining: float, bound: float
) -> None:
    captured.config.timeout_graceful_shutdown = configured
    compat.bound_graceful_shutdown(signal.getsignal(signal.SIGTERM), remaining)
    assert captured.config.timeout_graceful_shutdown == bound


@pytest.mark.parametrize("protocol", heads.GUARDED, ids=lambda p: p.__name__)
def test_uvicorns_protocols_hold_what_the_head_guard_reads(protocol: type[Any]) -> None:
    """A guarded protocol on a real socket: its attributes after the connection, its cycle's mid-body."""

    async def scenario() -> tuple[set[str], set[str]]:
        config = uvicorn.Config("app.main:app", http=heads.PROTOCOL)
        config.load()
        made: list[Any] = []

        def factory() -> Any:
            made.append(protocol(config=config, server_state=ServerState(), app_state={}))
            return made[-1]

        server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /normalize HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n{")  # the body not ended
        await writer.drain()
        for _ in range(200):
            if made and made[0].cycle is not None:
                break
            await asyncio.sleep(0.01)
        found = {name for name in compat.PROTOCOL_ATTRIBUTES if hasattr(made[0], name)}
        cycle = {name for name in compat.CYCLE_ATTRIBUTES if hasattr(made[0].cycle, name)}
        writer.close()
        server.close()
        return found, cycle

    found, cycle = asyncio.run(scenario())
    assert (found, cycle) == (set(compat.PROTOCOL_ATTRIBUTES), set(compat.CYCLE_ATTRIBUTES))


def test_normserve_serve_names_a_protocol_uvicorns_config_imports_guarded() -> None:
    config = uvicorn.Config("app.main:app", http=heads.PROTOCOL)
    config.load()
    assert config.http_protocol_class is heads.GuardedHttpToolsProtocol
