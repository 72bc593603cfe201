"""A real server whose JSON log lines a test reads: `normserve serve`, or plain `uvicorn app.main:app`."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import servers
from tests.live_server import MODELS, cli_server, server_env


@dataclass
class LoggedServer:
    base: str
    log: Path

    def lines(self) -> list[dict[str, Any]]:
        # Plain `uvicorn app.main:app` prints two plain lines before the app can set up logging.
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]

    def request_line(self, request_id: str, timeout: float = 10) -> dict[str, Any]:
        """The access line of a request: written once the response is sent, so wait for it a little."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [d for d in self.lines() if d.get("request_id") == request_id]
            if found:
                assert len(found) == 1, found
                return found[0]
            time.sleep(0.02)
        raise AssertionError(f"no log line for request {request_id}")


@contextmanager
def logged_server(
    tmp: Path, level: str, launcher: str = "normserve", model_dir: Path = MODELS, wait: str = "/v2/health/ready"
) -> Iterator[LoggedServer]:
    """A real server with its output in a file: `normserve serve`, or plain `uvicorn app.main:app`."""
    env = server_env({"NORMSERVE_MODEL_DIR": str(model_dir), "NORMSERVE_LOG_LEVEL": level})
    log = tmp / f"{launcher}-{level}.log"  # stdout too: uvicorn's access log goes there
    if launcher == "normserve":
        server = cli_server([str(Path(sys.executable).parent / "normserve"), "serve"], env, ready=wait, output=log)
    else:  # uvicorn's own access log is on by default here: the app must turn it off
        command = servers.uvicorn_command("--log-level", "info")
        server = servers.server_process(command, ready=wait, env=env, timeout=90, stop_timeout=30, output=log)
    with server as running:
        yield LoggedServer(running.base, log)
