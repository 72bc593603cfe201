"""docker-compose.yml run for real: `podman-compose up` (`docker compose up` where a Docker engine answers) on the
repository's own file, two replicas of the built image and nginx with deploy/nginx/'s config on the project's network.

No registry serves python:3.11-slim or nginx:stable here: the replicas are the image scripts/build-image.sh built
from its Debian base (NORMSERVE_IMAGE), and nginx an image built the same way from Debian's package (NGINX_IMAGE),
the two variables the compose file reads for that. nginx's ports are published on 127.0.0.1 at free ports
(NORMSERVE_PUBLISH_HTTP, NORMSERVE_PUBLISH_GRPC); nothing else of the file changes. nginx finds the replicas by the
service name, as Docker's DNS answers it. Then one replica is SIGKILLed under load, over HTTP and over gRPC.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.core.runtime import Runtime
from benchmarks.servers import free_port
from tests.containers import ENGINE, PODMAN, PREFIX, base_image, build, engine, env, logs, wait_ready
from tests.grpc_loadgen import GrpcOutcome
from tests.grpc_loadgen import mixed_cases as grpc_mixed_cases
from tests.grpc_loadgen import run_load as run_grpc_load
from tests.live_server import ROOT
from tests.loadgen import Outcome, Tally, assert_survived, mixed_cases, run_load

pytestmark = pytest.mark.slow

COMPOSE_FILE = ROOT / "docker-compose.yml"
PROJECT = f"{PREFIX}-compose"
NGINX_IMAGE = "normserve-nginx:debian"
NGINX_DOCKERFILE = """\
ARG BASE
FROM ${BASE}
ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin
# Logs to the container's output, as nginx:stable's do.
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx \\
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/* \\
    && ln -sf /dev/stdout /var/log/nginx/access.log && ln -sf /dev/stderr /var/log/nginx/error.log
CMD ["nginx", "-g", "daemon off;"]
"""
SECONDS, KILL_AFTER_S, CONCURRENCY = 12.0, 4.0, 16
# What nginx's error log says when a request meets the killed replica (and is resent to the other one): its
# connections closed by the kill, then its address refused, unreachable or silent once its network is gone.
UPSTREAM_ERRORS = re.compile(
    r"\((111: Connection refused|113: No route to host|110: Connection timed out)\) while connecting to upstream"
    r"|upstream prematurely closed|upstream timed out"
)


@dataclass(frozen=True)
class Deployment:
    base: str  # nginx's HTTP
    grpc: str  # nginx's gRPC address
    replicas: list[str]  # the replicas' container names
    nginx: str


def compose_command() -> list[str]:
    """podman-compose beside this interpreter (the test extra installs it) or on PATH; Docker's compose plugin."""
    if ENGINE is None:
        pytest.skip("neither podman nor a Docker engine here (bash scripts/system-deps.sh installs podman)")
    if not PODMAN:
        return [ENGINE, "compose"]
    beside = Path(sys.executable).parent / "podman-compose"
    found = str(beside) if beside.exists() else shutil.which("podman-compose")
    if found is None:
        pytest.skip("podman-compose is not installed (pip install -e '.[test]')")
    return [found]


def compose(
    args: list[str], environment: Mapping[str, str], timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    command = [*compose_command(), "-p", PROJECT, "-f", str(COMPOSE_FILE), *args]
    out = subprocess.run(command, cwd=ROOT, env=dict(environment), capture_output=True, text=True, timeout=timeout)
    if check:
        assert out.returncode == 0, f"{args[0]} exited {out.returncode}: {out.stdout[-3000:]}{out.stderr[-3000:]}"
    return out


def compose_environment(image: str, nginx_image: str, port: int, grpc_port: int) -> dict[str, str]:
    """The engine's environment with the compose file's defaults for every NORMSERVE_* setting (none inherited from
    this process), the local images, and nginx's ports published on loopback."""
    base = {k: v for k, v in env().items() if not k.startswith("NORMSERVE_")}
    return {
        **base,
        "NORMSERVE_IMAGE": image,
        "NGINX_IMAGE": nginx_image,
        "NORMSERVE_PUBLISH_HTTP": f"127.0.0.1:{port}",
        "NORMSERVE_PUBLISH_GRPC": f"127.0.0.1:{grpc_port}",
    }


def containers_of(service: str) -> list[str]:
    """The project's containers of one service, by the labels both compose implementations set."""
    labels = [f"label=com.docker.compose.project={PROJECT}", f"label=com.docker.compose.service={service}"]
    filters = [arg for label in labels for arg in ("--filter", label)]
    out = engine("ps", "-a", *filters, "--format", "{{.Names}}")
    return sorted(out.stdout.split())


def wait_healthy(name: str, timeout: float = 120) -> None:
    """The image's HEALTHCHECK (/v2/health/ready) passes: compose's `condition: service_healthy`, run here since
    podman before 4.6 cannot wait for it (podman-compose then starts nginx once the replicas have started)."""
    deadline = time.monotonic() + timeout
    while engine("healthcheck", "run", name, check=False).returncode != 0:
        assert time.monotonic() < deadline, f"{name} never became healthy\n{logs(name)}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def nginx_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Built every time: the engine's cache makes that instant once Debian's nginx is in."""
    context = tmp_path_factory.mktemp("nginx-image")
    (context / "Dockerfile").write_text(NGINX_DOCKERFILE)
    build(NGINX_IMAGE, context, f"BASE={base_image()}")
    return NGINX_IMAGE


@pytest.fixture(scope="module")
def deployment(image: str, nginx_image: str) -> Iterator[Deployment]:
    """`compose up -d` of the repository's docker-compose.yml; `compose down` at the end, whatever happened."""
    port, grpc_port = free_port(), free_port()
    environment = compose_environment(image, nginx_image, port, grpc_port)
    compose(["down", "-t", "0"], environment, check=False)  # a run of this pid that died half-way
    try:
        compose(["up", "-d"], environment)
        replicas, (nginx,) = containers_of("normserve"), containers_of("nginx")
        assert len(replicas) == 2, replicas  # deploy.replicas: NORMSERVE_REPLICAS, 2 by default
        for replica in replicas:
            wait_healthy(replica)
        wait_ready(f"http://127.0.0.1:{port}", nginx, timeout=60)
        yield Deployment(f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}", replicas, nginx)
    finally:
        out = compose(["down", "-t", "0"], environment, timeout=300, check=False)
        if out.returncode != 0:
            print(f"compose down exited {out.returncode}: {out.stderr[-2000:]}", file=sys.stderr)


def running(deployment: Deployment) -> None:
    """Every replica up: one killed by an earlier test is started again, as an operator would (a killed container
    is one stopped by hand, which `restart: unless-stopped` leaves stopped), and then nginx restarted, as
    nginx.conf says: a started container may get another address, and nginx resolved the service's at its start
    (without the restart, the gRPC test's kill left nginx only dead addresses: every call after it 502)."""
    restarted = False
    for name in deployment.replicas:
        if engine("inspect", "--format", "{{.State.Running}}", name).stdout.strip() != "true":
            engine("start", name)
            restarted = True
        wait_healthy(name)
    if restarted:
        engine("restart", deployment.nginx)
    wait_ready(deployment.base, deployment.nginx)


async def kill_later(name: str) -> float:
    await asyncio.sleep(KILL_AFTER_S)
    await asyncio.to_thread(engine, "kill", "--signal", "KILL", name)
    return time.monotonic()


def assert_killed(name: str) -> None:
    state = engine("inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", name).stdout.split()
    assert state == ["false", "137"], f"{state}\n{logs(name)}"


def test_compose_up_runs_two_replicas_behind_nginx_from_the_local_images(
    deployment: Deployment, image: str, nginx_image: str
) -> None:
    for name, want in [*((r, image) for r in deployment.replicas), (deployment.nginx, nginx_image)]:
        running, used = engine("inspect", "--format", "{{.State.Running}} {{.ImageName}}", name).stdout.split()
        assert running == "true", logs(name)
        assert used.removeprefix("localhost/").removeprefix("docker.io/library/") == want


def test_killing_a_replica_under_http_load_fails_no_request(deployment: Deployment, runtime: Runtime) -> None:
    running(deployment)
    tally: Tally[Outcome] = Tally()
    victim = deployment.replicas[0]

    async def scenario() -> float:
        load = run_load(deployment.base, mixed_cases(runtime, seed=1), CONCURRENCY, SECONDS, 200_000, tally)
        killed_at, _ = await asyncio.gather(kill_later(victim), load)
        return killed_at

    killed_at = asyncio.run(scenario())
    assert_survived(tally, killed_at, "compose failover (HTTP)")
    assert_killed(victim)
    met = UPSTREAM_ERRORS.findall(logs(deployment.nginx, tail=0))
    print(f"nginx met the killed replica {len(met)} times, and sent each of those requests to the other")
    assert met, "nginx never met the killed replica; the kill was not exercised"


def test_killing_a_replica_under_grpc_load_fails_no_call_with_the_retry_policy(
    deployment: Deployment, runtime: Runtime
) -> None:
    running(deployment)
    tally: Tally[GrpcOutcome] = Tally()
    victim = deployment.replicas[1]

    async def scenario() -> float:
        cases = grpc_mixed_cases(runtime, seed=1)
        load = run_grpc_load(deployment.grpc, cases, CONCURRENCY, SECONDS, 200_000, tally, retry=True)
        killed_at, _ = await asyncio.gather(kill_later(victim), load)
        return killed_at

    killed_at = asyncio.run(scenario())
    assert_survived(tally, killed_at, "compose failover (gRPC)")
    assert_killed(victim)


def test_compose_file_reads_the_images_and_published_ports_from_the_environment() -> None:
    """What lets it run where no registry answers, and on loopback; the defaults are Docker Hub's and 8000/8001."""
    text = COMPOSE_FILE.read_text()
    for line in (
        "image: ${NORMSERVE_IMAGE:-normserve:latest}",
        "image: ${NGINX_IMAGE:-nginx:stable}",
        '- "${NORMSERVE_PUBLISH_HTTP:-8000}:8000"',
        '- "${NORMSERVE_PUBLISH_GRPC:-8001}:8001"',
    ):
        assert line in text, line
