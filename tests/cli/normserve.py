"""The installed `normserve` command run as users run it, for the CLI's tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.live_server import MODELS, ROOT

NORMSERVE = Path(sys.executable).parent / "normserve"


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`normserve ARGS` in the checkout, on the repo's models unless env says otherwise."""
    full_env = {**os.environ, "NORMSERVE_MODEL_DIR": str(MODELS), **(env or {})}
    return subprocess.run(
        [str(NORMSERVE), *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again on return: nothing listens there
