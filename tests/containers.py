"""The built image, run for real: podman (or a Docker engine) on the host's network, containers named per test run.

Containers listen on 127.0.0.1 at free ports (`--network host`: no CNI set-up, nothing bound beyond loopback), and
every container this process starts is removed by its name when its test ends. podman takes CONTAINERS_CONF from
deploy/podman/containers.conf (runc, limits it may lower) unless the environment sets one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from benchmarks.servers import free_port
from tests.live_server import ROOT

CONTAINERS_CONF = ROOT / "deploy" / "podman" / "containers.conf"
# One tag per checkout: test runs of two worktrees on one machine build and run their own code.
IMAGE = f"normserve:test-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]}"
PREFIX = f"normserve-test-{os.getpid()}"
DEBIAN_BASE, PULLED_BASE = "normserve-base:bookworm", "python:3.11-slim"  # scripts/build-image.sh's two bases


def _docker_engine() -> str | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode == 0:
        return docker
    return None


ENGINE = shutil.which("podman") or _docker_engine()
PODMAN = ENGINE is not None and os.path.basename(ENGINE) == "podman"


def env() -> dict[str, str]:
    """The engine's environment: podman's settings for these machines unless CONTAINERS_CONF is set."""
    return {"CONTAINERS_CONF": str(CONTAINERS_CONF), **os.environ} if PODMAN else dict(os.environ)


def base_image() -> str:
    """The base scripts/build-image.sh built the image on: its Debian-package base where it made one."""
    return DEBIAN_BASE if engine("image", "inspect", DEBIAN_BASE, check=False).returncode == 0 else PULLED_BASE


def require_engine() -> str:
    if ENGINE is None:
        pytest.skip("neither podman nor a Docker engine here (bash scripts/system-deps.sh installs podman)")
    return ENGINE


def require_podman() -> str:
    if not PODMAN:
        pytest.skip(f"podman only, and this machine has {require_engine()}")
    return require_engine()


def engine(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([require_engine(), *args], env=env(), capture_output=True, text=True, timeout=timeout)
    if check:
        assert out.returncode == 0, f"{args[0]} exited {out.returncode}: {out.stdout}{out.stderr}"
    return out


def build_image() -> tuple[str, str]:
    """scripts/build-image.sh as a user runs it (its cache makes an up-to-date image a matter of seconds): the tag
    and the script's last line, its run time and the image's size."""
    require_engine()
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-image.sh")],
        env={**env(), "IMAGE": IMAGE},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return IMAGE, out.stdout.strip().splitlines()[-1]


def build(tag: str, context: Path, *build_args: str) -> None:
    """Build context's Dockerfile as scripts/build-image.sh builds: podman on the host's network and certificates."""
    podman = ["--format", "docker", "--network", "host", "-v", "/etc/ssl/certs:/etc/ssl/certs:ro"] if PODMAN else []
    args = [f"--build-arg={a}" for a in build_args]
    engine("build", *podman, *args, "-t", tag, str(context), timeout=900)


def readable_copy(source: Path, target: Path) -> None:
    """source's tree copied to target, readable by everyone: the containers' uid 10001 reads it whatever the umask."""
    shutil.copytree(source, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))


@dataclass(frozen=True)
class Container:
    name: str
    port: int
    grpc_port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


def run_args(name: str, environment: Mapping[str, str], args: Sequence[str] = ()) -> list[str]:
    """`run -d` with the image's hardening: a read-only root with an in-memory /tmp, on the host's loopback."""
    flags = [f"--env={k}={v}" for k, v in environment.items()]
    return ["run", "-d", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp", *flags, *args]


@contextmanager
def container(
    purpose: str, environment: Mapping[str, str] | None = None, args: Sequence[str] = (), ready: bool = True
) -> Iterator[Container]:
    """The image serving on free ports of 127.0.0.1; removed by its name at the end, whatever happened."""
    name, port, grpc_port = f"{PREFIX}-{purpose}", free_port(), free_port()
    served = {"NORMSERVE_HOST": "127.0.0.1", "NORMSERVE_PORT": str(port), "NORMSERVE_GRPC_PORT": str(grpc_port)}
    engine("rm", "-f", name, check=False)
    engine(*run_args(name, {**(environment or {}), **served}, args), IMAGE)
    try:
        box = Container(name, port, grpc_port)
        if ready:
            wait_ready(box.base, name)
        yield box
    finally:
        remove(name)


def remove(*names: str) -> None:
    now = ["-t", "0"] if PODMAN else []  # docker rm -f kills at once; podman's waits its stop timeout
    engine("rm", "-f", *now, *names, check=False)


def logs(name: str, tail: int = 4000) -> str:
    """The container's output and errors, the last `tail` characters of each (0: all of them)."""
    out = engine("logs", name, check=False)
    return out.stdout[-tail:] + out.stderr[-tail:]


def wait_ready(base: str, name: str = "", timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(base + "/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{base} never became ready\n{logs(name) if name else ''}"
        time.sleep(0.2)
