"""A real uvicorn process on 127.0.0.1 for integration tests, started and stopped by PID."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"


@contextmanager
def live_server(env: Mapping[str, str] | None = None, wait_ready: bool = True, timeout: float = 90.0) -> Iterator[str]:
    """Serve app.main:app on a socket bound here (no port race) and yield its base URL."""
    with server_process(env, wait_ready, timeout) as (base, _):
        yield base


@contextmanager
def server_process(
    env: Mapping[str, str] | None = None, wait_ready: bool = True, timeout: float = 90.0, args: Sequence[str] = ()
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """As live_server, also yielding the process (for tests that signal it or read its memory); args go to uvicorn."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # uvicorn takes an --fd socket for AF_UNIX, so asyncio never sets TCP_NODELAY on its connections; set on
    # the listener, Linux passes it on to each accepted one (without it, keep-alive requests wait ~40 ms).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    full_env = {**os.environ, "NORMSERVE_MODEL_DIR": str(MODELS), "NORMSERVE_LOG_LEVEL": "warning", **(env or {})}
    cmd = [sys.executable, "-m", "uvicorn", "app.main:app", "--fd", str(sock.fileno()), "--log-level", "warning", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, pass_fds=[sock.fileno()])
    sock.close()
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(base, proc, "/v2/health/ready" if wait_ready else "/v2/health/live", timeout)
        yield base, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait(base: str, proc: subprocess.Popen[bytes], path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before {path} answered 200")
        try:
            if httpx.get(base + path, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{path} did not answer 200 within {timeout} s")
