"""A real server with gRPC on: uvicorn on a pre-bound HTTP socket, gRPC on a free port, its output in a file."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from benchmarks.servers import free_port, server_process, uvicorn_command
from tests.live_server import server_env

# The admin token of the shared live server (tests/conftest.py): admin RPCs are closed without one.
ADMIN_TOKEN = "grpc-admin-token"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@dataclass(frozen=True)
class GrpcServer:
    base: str  # http://127.0.0.1:PORT
    address: str  # 127.0.0.1:GRPC_PORT, as tritonclient.grpc takes it
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def grpc_port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def log_lines(self) -> list[dict[str, Any]]:
        """The JSON lines the server wrote so far (uvicorn's own plain lines are skipped)."""
        lines = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                lines.append(orjson.loads(line))
        return lines

    def request_line(self, request_id: str, timeout: float = 10) -> dict[str, Any]:
        """The access line of one request id (the line is written once the call has answered)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [
                d
                for d in self.log_lines()
                if d.get("logger") == "normserve.access" and d.get("request_id") == request_id
            ]
            if found:
                return found[-1]
            assert time.monotonic() < deadline, f"no access line for request id {request_id!r}"
            time.sleep(0.05)


@contextmanager
def grpc_server(
    tmp: Path,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    timeout: float = 90.0,
    wait_ready: bool = True,
) -> Iterator[GrpcServer]:
    """app.main:app with NORMSERVE_GRPC_PORT on a free port (logs at info in tmp/server.log), stopped by its PID;
    yielded once ready, or once live (wait_ready=False)."""
    port = free_port()
    full_env = server_env({"NORMSERVE_GRPC_PORT": str(port), "NORMSERVE_LOG_LEVEL": "info", **(env or {})})
    log = tmp / "server.log"
    command = uvicorn_command("--log-level", "warning")
    ready = "/v2/health/ready" if wait_ready else "/v2/health/live"
    with server_process(command, ready=ready, env=full_env, args=args, output=log, timeout=timeout) as server:
        yield GrpcServer(server.base, f"127.0.0.1:{port}", server.proc, log)
