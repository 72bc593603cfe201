"""`normserve serve` on a port that is taken: one line naming the port and how to change it, exit 2, nothing loaded."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from app.cli.serve import cannot_listen
from tests.cli.normserve import run
from tests.live_server import MODELS


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port on 127.0.0.1 that this test listens on, as another server would."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def serve(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    start = time.monotonic()
    out = run(
        "serve", "--model-dir", str(MODELS), *args, env={"NORMSERVE_HOST": "127.0.0.1", **(env or {})}, timeout=60
    )
    return out.returncode, out.stdout, out.stderr, time.monotonic() - start


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_a_taken_port_is_named_with_the_flag_and_setting_that_change_it(held_port: int, how: str) -> None:
    args, env = (["--port", str(held_port)], None) if how == "flag" else ([], {"NORMSERVE_PORT": str(held_port)})
    code, stdout, stderr, seconds = serve(*args, env=env)
    assert code == 2
    assert stdout == ""
    assert stderr.splitlines() == [
        f"normserve serve: error: port {held_port} on 127.0.0.1 is already in use; "
        "choose another with --port or NORMSERVE_PORT"
    ]
    assert seconds < 20  # refused before any model was loaded (a warm-up would log `ready` first)


def test_an_address_this_host_does_not_have_is_named_with_its_settings() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: the bind fails, no packet is sent anywhere.
    code, stdout, stderr, _ = serve("--host", "192.0.2.1", "--port", str(port))
    assert code == 2
    assert stderr.splitlines() == [
        f"normserve serve: error: cannot listen on 192.0.2.1:{port} (Cannot assign requested address); "
        "change --host or --port (NORMSERVE_HOST, NORMSERVE_PORT)"
    ]


def test_a_free_port_passes_the_check_and_is_let_go_at_once() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cannot_listen("127.0.0.1", port) is None
    with socket.socket() as s:  # uvicorn binds it next: the check must not still hold it
        s.bind(("127.0.0.1", port))
        s.listen()
