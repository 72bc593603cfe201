"""docker-compose.yml run for real: two replicas of the built image and nginx with deploy/nginx/'s config.

No registry serves nginx:stable here, so nginx is an image built the same way as normserve's, from Debian's package.
The replicas take the compose service's environment, read-only root, tmpfs and bind mount; on the host's network
each replica and nginx listen on 127.0.0.1 at free ports, so the shipped nginx.conf's upstreams and listeners are
mapped onto those, and nothing else in it changes. nginx starts once every replica's HEALTHCHECK passes, as
compose's `condition: service_healthy` says. Then one replica is SIGKILLed under load, over HTTP and over gRPC.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import yaml

from app.core.runtime import Runtime
from benchmarks.servers import free_port
from tests.containers import (
    PODMAN,
    PREFIX,
    Container,
    base_image,
    build,
    container,
    engine,
    logs,
    readable_copy,
    remove,
    run_args,
    wait_ready,
)
from tests.grpc_loadgen import GrpcOutcome
from tests.grpc_loadgen import mixed_cases as grpc_mixed_cases
from tests.grpc_loadgen import run_load as run_grpc_load
from tests.live_server import ROOT
from tests.loadgen import Outcome, Tally, assert_survived, mixed_cases, run_load

pytestmark = pytest.mark.slow

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
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
NGINX = f"{PREFIX}-nginx"
# What nginx's error log says when a request meets the killed replica (and is resent to the other one).
UPSTREAM_ERRORS = re.compile(r"\(111: Connection refused\) while connecting to upstream|upstream prematurely closed")


def compose_value(value: object) -> str:
    """A compose environment value with its `${VAR:-default}` interpolated as an unset VAR gives."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))


def replica_settings(shared: Path) -> tuple[dict[str, str], list[str]]:
    """The compose service's environment, and its bind mounts as `run` flags (read_only and tmpfs are run_args').

    Each bind mount's source is a copy in shared, a folder everyone may read: the replicas run as uid 10001, and a
    checkout (a CI clone) may sit in a folder only its owner can enter."""
    service = COMPOSE["x-normserve"]
    assert service["read_only"] is True and service["tmpfs"] == ["/tmp"]
    environment = {k: compose_value(v) for k, v in service["environment"].items()}
    flags = []
    for volume in service["volumes"]:
        source = shared / Path(volume["source"]).name
        readable_copy(ROOT / volume["source"], source)
        flags += ["-v", f"{source}:{volume['target']}:{'ro' if volume['read_only'] else 'rw'}"]
    return environment, flags


def nginx_conf(tmp: Path, replicas: list[Container], port: int, grpc_port: int) -> Path:
    """deploy/nginx/nginx.conf with the service name's upstreams and the published ports mapped onto loopback."""
    text = (ROOT / "deploy" / "nginx" / "nginx.conf").read_text()
    for published, listen in ((8000, f"listen 127.0.0.1:{port};"), (8001, f"listen 127.0.0.1:{grpc_port} http2;")):
        text, n = re.subn(rf"listen {published}( http2)?;", listen, text)
        assert n == 1, f"no `listen {published}` in nginx.conf"
    for published, ports in ((8000, [r.port for r in replicas]), (8001, [r.grpc_port for r in replicas])):
        servers = lambda m, ports=ports: "\n".join(f"        server 127.0.0.1:{p} {m.group(1)};" for p in ports)  # noqa: E731
        text, n = re.subn(rf"^ *server normserve:{published} ([^;]*);", servers, text, flags=re.M)
        assert n == 1, f"no `server normserve:{published}` in nginx.conf"
    path = tmp / "nginx.conf"
    path.write_text(text)
    path.chmod(0o644)
    return path


@pytest.fixture(scope="module")
def nginx_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Built every time: the engine's cache makes that instant once Debian's nginx is in."""
    context = tmp_path_factory.mktemp("nginx-image")
    (context / "Dockerfile").write_text(NGINX_DOCKERFILE)
    build(NGINX_IMAGE, context, f"BASE={base_image()}")
    return NGINX_IMAGE


@pytest.fixture(scope="module")
def deployment(image: str, nginx_image: str) -> Iterator[tuple[str, str, list[Container]]]:
    """Two replicas, then nginx once both are healthy: nginx's HTTP base, its gRPC address, and the replicas."""
    conf_dir = Path(tempfile.mkdtemp(prefix="normserve-compose-"))
    conf_dir.chmod(0o755)
    environment, mounts = replica_settings(conf_dir)
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, conf_dir)
        replicas = [stack.enter_context(container(f"replica-{i}", environment, mounts, ready=False)) for i in (1, 2)]
        for replica in replicas:
            wait_ready(replica.base, replica.name)
            if PODMAN:  # compose's `depends_on: condition: service_healthy`: the image's HEALTHCHECK
                engine("healthcheck", "run", replica.name)
        port, grpc_port = free_port(), free_port()
        conf = nginx_conf(conf_dir, replicas, port, grpc_port)
        yield stack.enter_context(nginx(nginx_image, conf, port)), f"127.0.0.1:{grpc_port}", replicas


@contextmanager
def nginx(image: str, conf: Path, port: int) -> Iterator[str]:
    """nginx with the compose service's mounts (nginx.conf the mapped one) and read-only root; its HTTP base."""
    service = COMPOSE["services"]["nginx"]
    assert service["read_only"] is True and service["tmpfs"] == ["/tmp"]
    mounts = []
    for volume in service["volumes"]:
        source, target, mode = volume.split(":")
        mounts += ["-v", f"{conf if target == '/etc/nginx/nginx.conf' else (ROOT / source).resolve()}:{target}:{mode}"]
    name = NGINX
    remove(name)
    engine(*run_args(name, {}, mounts), image)
    try:
        wait_ready(f"http://127.0.0.1:{port}", name, timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        remove(name)


def running(replicas: list[Container]) -> None:
    """Every replica up: one killed by an earlier test is started again, as compose's `restart: unless-stopped`."""
    for replica in replicas:
        state = engine("inspect", "--format", "{{.State.Running}}", replica.name).stdout.strip()
        if state != "true":
            engine("start", replica.name)
        wait_ready(replica.base, replica.name)


async def kill_later(name: str) -> float:
    await asyncio.sleep(KILL_AFTER_S)
    await asyncio.to_thread(engine, "kill", "--signal", "KILL", name)
    return time.monotonic()


def test_killing_a_replica_under_http_load_fails_no_request(
    deployment: tuple[str, str, list[Container]], runtime: Runtime
) -> None:
    base, _, replicas = deployment
    running(replicas)
    tally: Tally[Outcome] = Tally()

    async def scenario() -> float:
        load = run_load(base, mixed_cases(runtime, seed=1), CONCURRENCY, SECONDS, 200_000, tally)
        killed_at, _ = await asyncio.gather(kill_later(replicas[0].name), load)
        return killed_at

    killed_at = asyncio.run(scenario())
    assert_survived(tally, killed_at, "compose failover (HTTP)")
    assert engine("inspect", "--format", "{{.State.ExitCode}}", replicas[0].name).stdout.strip() == "137"
    met = UPSTREAM_ERRORS.findall(logs(NGINX, tail=0))
    print(f"nginx met the killed replica {len(met)} times, and sent each of those requests to the other")
    assert met, "nginx never met the killed replica; the kill was not exercised"


def test_killing_a_replica_under_grpc_load_fails_no_call_with_the_retry_policy(
    deployment: tuple[str, str, list[Container]], runtime: Runtime
) -> None:
    _, address, replicas = deployment
    running(replicas)
    tally: Tally[GrpcOutcome] = Tally()

    async def scenario() -> float:
        cases = grpc_mixed_cases(runtime, seed=1)
        load = run_grpc_load(address, cases, CONCURRENCY, SECONDS, 200_000, tally, retry=True)
        killed_at, _ = await asyncio.gather(kill_later(replicas[1].name), load)
        return killed_at

    killed_at = asyncio.run(scenario())
    assert_survived(tally, killed_at, "compose failover (gRPC)")
    assert engine("inspect", "--format", "{{.State.ExitCode}}", replicas[1].name).stdout.strip() == "137", logs(
        replicas[1].name
    )
