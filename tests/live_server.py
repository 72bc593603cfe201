"""Real servers on 127.0.0.1 for integration tests: thin wrappers of benchmarks.servers.server_process."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from benchmarks.servers import HOST, ROOT, Server, free_port, uvicorn_command
from benchmarks.servers import server_process as _server_process

__all__ = ["MODELS", "ROOT", "cli_server", "live_server", "server_env", "server_process", "wait_every_worker_ready"]

MODELS = ROOT / "models"


def server_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the repo's models, warning logs and gRPC off, then env on top.

    gRPC is off unless a test asks (NORMSERVE_GRPC_PORT from benchmarks.servers.free_port()): a server whose gRPC
    port another server holds does not start, so no two test servers may take the default 8001."""
    base = {"NORMSERVE_MODEL_DIR": str(MODELS), "NORMSERVE_LOG_LEVEL": "warning", "NORMSERVE_GRPC_PORT": "0"}
    return {**os.environ, **base, **(env or {})}


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
    ready = "/v2/health/ready" if wait_ready else "/v2/health/live"
    command = uvicorn_command("--log-level", "warning")
    with _server_process(command, ready=ready, env=server_env(env), args=args, timeout=timeout) as server:
        yield server.base, server.proc


@contextmanager
def cli_server(
    command: Sequence[str],
    env: Mapping[str, str],
    cwd: Path = ROOT,
    ready: str = "/v2/health/ready",
    timeout: float = 90.0,
    output: Path | None = None,
) -> Iterator[Server]:
    """A command that listens where NORMSERVE_HOST and NORMSERVE_PORT say (`normserve serve`), on a free port.

    env is its whole environment, to which the address is added; it is stopped as every server is, by its PID.
    ROOT goes first on PYTHONPATH, so that it runs this checkout's code: the venv's `normserve` script imports the
    checkout that the venv was installed from (pip install -e), another one in a second worktree sharing that venv.
    """
    port = free_port()
    path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    full_env = {
        "NORMSERVE_GRPC_PORT": "0",
        **env,
        "NORMSERVE_HOST": HOST,
        "NORMSERVE_PORT": str(port),
        "PYTHONPATH": path,
    }
    with _server_process(
        command, port=port, ready=ready, cwd=cwd, env=full_env, timeout=timeout, stop_timeout=30, output=output
    ) as server:
        yield server


def wait_every_worker_ready(base: str, in_a_row: int = 20, timeout: float = 90) -> None:
    """With several workers the first 200 may come from one of them only: ask on new connections until in_a_row 200s."""
    deadline, streak = time.monotonic() + timeout, 0
    while streak < in_a_row:
        assert time.monotonic() < deadline, "the workers never all became ready"
        streak = streak + 1 if httpx.get(base + "/v2/health/ready").status_code == 200 else 0
