"""Failover: nginx (deploy/nginx/proxy.conf) before two replicas; SIGKILL one under load, and the client loses nothing."""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from app.core.runtime import Runtime
from tests.grpc_loadgen import GrpcOutcome
from tests.grpc_loadgen import mixed_cases as grpc_mixed_cases
from tests.grpc_loadgen import run_load as run_grpc_load
from tests.live_server import ROOT, server_process
from tests.loadgen import Outcome, Tally, assert_survived, mixed_cases, run_load

NGINX = Path("/usr/sbin/nginx")
DEPLOY = ROOT / "deploy" / "nginx"
SECONDS = 12.0
KILL_AFTER_S = 4.0
CONCURRENCY = 16

CONFIG = """
daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
{user}
events {{ worker_connections 512; }}
http {{
    log_format upstreams '$msec $status "$upstream_addr" "$upstream_status"';
    access_log {tmp}/access.log upstreams;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream normserve {{
{servers}
        keepalive 32;
    }}
    upstream normserve_grpc {{
{grpc_servers}
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://normserve;
            include {proxy_conf};
        }}
    }}
    server {{
        listen 127.0.0.1:{grpc_port} http2;
        location / {{
            grpc_pass grpc://normserve_grpc;
            include {grpc_conf};
        }}
    }}
}}
"""


@pytest.fixture(autouse=True)
def nginx_installed() -> None:
    """A missing nginx fails (as a missing export does), rather than skipping the failover proof."""
    if not NGINX.exists():
        pytest.fail(f"{NGINX} missing: run scripts/system-deps.sh (Debian's nginx package)")


def upstream_parameters() -> str:
    """The passive health-check parameters of the shipped config (max_fails, fail_timeout)."""
    match = re.search(r"server normserve:8000 ([^;]*);", (DEPLOY / "nginx.conf").read_text())
    assert match, "deploy/nginx/nginx.conf has no `server normserve:8000 ...;` line"
    return match.group(1)


def render(tmp: Path, port: int, upstreams: list[str], grpc_port: int = 0, grpc_upstreams: Sequence[str] = ()) -> Path:
    # As root, nginx's workers would switch to `nobody`, who cannot enter pytest's tmp_path.
    user = ""
    if os.geteuid() == 0:
        user = f"user {pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name};"
    servers = "\n".join(f"        server {u} {upstream_parameters()};" for u in upstreams)
    # Without gRPC replicas, an upstream nobody reaches, so that the one template serves both tests.
    grpc = "\n".join(f"        server {u} {upstream_parameters()};" for u in grpc_upstreams or ["127.0.0.1:9"])
    text = CONFIG.format(
        tmp=tmp,
        user=user,
        servers=servers,
        port=port,
        proxy_conf=DEPLOY / "proxy.conf",
        grpc_servers=grpc,
        grpc_port=grpc_port or free_port(),
        grpc_conf=DEPLOY / "grpc.conf",
    )
    path = tmp / "nginx.conf"
    path.write_text(text)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def nginx(tmp: Path, upstreams: list[str], grpc_port: int = 0, grpc_upstreams: Sequence[str] = ()) -> Iterator[str]:
    """nginx in the foreground on a loopback port (and grpc_port for grpc_upstreams), stopped by its PID."""
    port = free_port()
    conf = render(tmp, port, upstreams, grpc_port, grpc_upstreams)
    proc = subprocess.Popen([str(NGINX), "-p", str(tmp), "-e", str(tmp / "error.log"), "-c", str(conf)])
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, (tmp / "error.log").read_text()
            try:
                if httpx.get(base + "/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "nginx did not answer"
            time.sleep(0.05)
        yield base
    finally:
        proc.terminate()  # SIGTERM: nginx's fast shutdown
        proc.wait(timeout=15)


def wait_ready(base: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(base + "/v2/health/ready", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, f"{base} never became ready"
        time.sleep(0.1)


async def load_and_kill(base: str, victim: subprocess.Popen[bytes], runtime: Runtime) -> tuple[Tally[Outcome], float]:
    tally: Tally[Outcome] = Tally()

    async def kill_later() -> float:
        await asyncio.sleep(KILL_AFTER_S)
        victim.send_signal(signal.SIGKILL)
        return time.monotonic()

    killed_at, _ = await asyncio.gather(
        kill_later(), run_load(base, mixed_cases(runtime, seed=1), CONCURRENCY, SECONDS, 200_000, tally)
    )
    return tally, killed_at


@pytest.mark.slow
def test_sigkill_of_one_replica_under_load_loses_no_request(tmp_path: Path, runtime: Runtime) -> None:
    env = {"NORMSERVE_LOG_LEVEL": "warning", "NORMSERVE_INTRA_OP_THREADS": "1"}
    with ExitStack() as stack:
        (base_a, proc_a), (base_b, proc_b) = (
            stack.enter_context(server_process(env, wait_ready=False)) for _ in range(2)
        )
        for base in (base_a, base_b):
            wait_ready(base)
        ports = [base.rsplit(":", 1)[1] for base in (base_a, base_b)]
        lb = stack.enter_context(nginx(tmp_path, [f"127.0.0.1:{p}" for p in ports]))
        tally, killed_at = asyncio.run(load_and_kill(lb, proc_a, runtime))
        assert proc_a.wait(timeout=10) == -signal.SIGKILL
        assert proc_b.poll() is None
    log = (tmp_path / "access.log").read_text().splitlines()
    retried = [line for line in log if ", " in line]  # "$upstream_addr" lists every replica tried
    assert_survived(tally, killed_at, "failover", f", retried by nginx {len(retried)}")
    assert retried, "no request was retried on the other replica; the kill was not exercised"
    assert any(f":{ports[1]}" in line for line in retried)


async def grpc_load_and_kill(
    address: str, victim: subprocess.Popen[bytes], runtime: Runtime
) -> tuple[Tally[GrpcOutcome], float]:
    tally: Tally[GrpcOutcome] = Tally()

    async def kill_later() -> float:
        await asyncio.sleep(KILL_AFTER_S)
        victim.send_signal(signal.SIGKILL)
        return time.monotonic()

    cases = grpc_mixed_cases(runtime, seed=1)
    load = run_grpc_load(address, cases, CONCURRENCY, SECONDS, 200_000, tally, retry=True)
    killed_at, _ = await asyncio.gather(kill_later(), load)
    return tally, killed_at


@pytest.mark.slow
def test_sigkill_of_one_replica_under_grpc_load_loses_no_call(tmp_path: Path, runtime: Runtime) -> None:
    """nginx retries what never reached the dead replica; what was in flight there comes back UNAVAILABLE (nginx
    streams gRPC requests unbuffered, so it cannot resend them) and the client's retry policy resends it."""
    grpc_ports = [free_port(), free_port()]
    with ExitStack() as stack:
        (base_a, proc_a), (base_b, proc_b) = (
            stack.enter_context(
                server_process({"NORMSERVE_INTRA_OP_THREADS": "1", "NORMSERVE_GRPC_PORT": str(p)}, wait_ready=False)
            )
            for p in grpc_ports
        )
        for base in (base_a, base_b):
            wait_ready(base)
        lb_port = free_port()
        http = [f"127.0.0.1:{base.rsplit(':', 1)[1]}" for base in (base_a, base_b)]
        stack.enter_context(nginx(tmp_path, http, lb_port, [f"127.0.0.1:{p}" for p in grpc_ports]))
        tally, killed_at = asyncio.run(grpc_load_and_kill(f"127.0.0.1:{lb_port}", proc_a, runtime))
        assert proc_a.wait(timeout=10) == -signal.SIGKILL
        assert proc_b.poll() is None
    log = (tmp_path / "access.log").read_text().splitlines()
    retried = [line for line in log if ", " in line]  # "$upstream_addr" lists every replica tried
    assert_survived(tally, killed_at, "gRPC failover", f", retried by nginx {len(retried)}")
    assert retried and any(f":{grpc_ports[1]}" in line for line in retried), "no call was retried on the other replica"


def test_shipped_nginx_config_is_valid(tmp_path: Path) -> None:
    # As docker compose mounts it, with the container's paths and the service's name mapped onto this machine.
    text = (DEPLOY / "nginx.conf").read_text()
    # /tmp/ first: the checkout itself may live under /tmp (a CI clone), and its path must stay intact.
    text = text.replace("/tmp/", f"{tmp_path}/").replace("/etc/nginx/normserve/", f"{DEPLOY}/")
    text = text.replace("server normserve:8000", "server 127.0.0.1:8000").replace("normserve:8001", "127.0.0.1:8001")
    conf = tmp_path / "nginx.conf"
    conf.write_text(text)
    check = subprocess.run(
        [str(NGINX), "-t", "-p", str(tmp_path), "-e", str(tmp_path / "error.log"), "-c", str(conf)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert check.returncode == 0, check.stderr
    assert "test is successful" in check.stderr
