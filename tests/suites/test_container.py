"""The container: the Dockerfile and its pins, then the image scripts/build-image.sh builds, run as users run it.

Each container runs the image on a read-only root with an in-memory /tmp, on the host's loopback at free ports
(tests/containers.py): ready, seed 003 over HTTP and gRPC, uid 10001, the HEALTHCHECK, a drain on `podman stop`,
poll mode on a read-only bind mount, and traces to an OTLP receiver on the host.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from app.core import reference
from app.core.seeds import SEED003
from tests.containers import PODMAN, Container, container, engine, env, logs, readable_copy, require_engine
from tests.live_server import MODELS, ROOT
from tests.server.otlp_receiver import otlp_receiver, tracing_env
from tests.suites.test_drain import ONE_THREAD, Load, encoder_request

DOCKERFILE = (ROOT / "Dockerfile").read_text()
# Its instructions, continuation lines joined (single spaces), comments left out.
STEPS = [" ".join(line.split()) for line in DOCKERFILE.replace("\\\n", " ").splitlines() if line[:1] not in "#"]
PINS = dict(
    line.split("==") for line in (ROOT / "requirements-serve.txt").read_text().splitlines() if line[:1].isalnum()
)
# 415 MB before text encoders; `tokenizers` (12 MB) brings its declared closure (huggingface_hub, hf-xet, fsspec,
# httpx2, ...: 27 MB that serving never imports), which the image installs as pip resolves it: 453 MB measured.
MAX_IMAGE_BYTES = 470_000_000
ATOL = 1e-5  # onnxruntime's float32 against the float64 reference, on any CPU's kernels
# The closure of normserve's requirements as the image's own metadata says (markers evaluated, extras followed),
# and every distribution installed there.
CLOSURE = """
import importlib.metadata as m, json
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as c
seen = {}
def walk(name, extras):
    for r in map(Requirement, m.distribution(name).requires or []):
        if r.marker and not any(r.marker.evaluate({"extra": e}) for e in extras or {""}):
            continue
        key = c(r.name)
        if key in seen and r.extras <= seen[key]:
            continue
        seen[key] = seen.get(key, set()) | r.extras
        walk(r.name, r.extras)
walk("normserve", set())
print(json.dumps({"closure": sorted(seen), "installed": {c(d.name): d.version for d in m.distributions()}}))
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def seed_003_reference() -> np.ndarray:
    return reference.layer_norm(np.asarray(SEED003.x, np.float32), eps=SEED003.eps).output


# ---- the Dockerfile and requirements-serve.txt ---------------------------------------------------------------


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    out = subprocess.run([hadolint, "Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_installs_the_pins_and_the_project_only_and_runs_as_uid_10001() -> None:
    assert not [step for step in STEPS if "torch" in step or "index-url" in step]
    runs = [step for step in STEPS if "pip install" in step]
    assert runs == [
        "RUN /opt/venv/bin/pip install --no-deps -r requirements-serve.txt",
        "RUN /opt/venv/bin/pip install --no-deps . && /opt/venv/bin/pip check"
        " && /opt/venv/bin/python -m pip uninstall -y -q pip setuptools"
        " && find /opt/venv -depth -type d -path '*/site-packages/*/tests' -exec rm -rf {} +",
    ]
    assert "USER 10001" in STEPS and "EXPOSE 8000 8001" in STEPS
    assert any("--uid 10001 --gid 10001" in step for step in STEPS)
    (probe,) = [step for step in STEPS if step.startswith("HEALTHCHECK")]
    assert re.search(r'CMD \["python", "-c", ".*/v2/health/ready', probe) and "NORMSERVE_PORT" in probe


def test_requirements_serve_pins_every_dependency_of_pyproject_and_no_exporter() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    direct = {canonical(re.split(r"[\[<>=!~; ]", d, maxsplit=1)[0]) for d in project["dependencies"]}
    pinned = {canonical(name) for name in PINS}
    assert direct <= pinned, f"not pinned: {sorted(direct - pinned)}"
    assert {"opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"} <= pinned  # tracing on in the image
    assert not pinned & {"torch", "onnx", "onnxscript"}
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) and re.fullmatch(r"[\w.]+", v) for name, v in PINS.items())


def test_every_serving_dependency_is_bounded_above_and_below_around_the_image_pin() -> None:
    """`pip install -e .` takes only versions the image pins and the tests run: a new release needs its bound raised."""
    from packaging.requirements import Requirement

    pins = {canonical(name): version for name, version in PINS.items()}
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(line)
        operators = {spec.operator for spec in requirement.specifier}
        assert {">=", "<"} <= operators, f"{line}: expected a lower and an upper bound"
        assert requirement.specifier.contains(pins[canonical(requirement.name)]), f"{line}: the image pins outside it"


# ---- the built image -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_build_script_ends_with_its_run_time_and_the_images_size_at_most_470_mb(built: tuple[str, str]) -> None:
    tag, line = built
    size = int(engine("image", "inspect", "--format", "{{.Size}}", tag).stdout)
    assert re.fullmatch(
        rf"built {tag} on (normserve-base:bookworm|python:3\.11-slim) in \d+ s: {size // 1000000} MB", line
    )
    assert size <= MAX_IMAGE_BYTES, f"{size / 1e6:.0f} MB"


@pytest.mark.slow
def test_image_holds_exactly_the_pinned_closure_of_pyproject_and_no_pip_or_torch(image: str) -> None:
    found = json.loads(engine("run", "--rm", image, "python", "-c", CLOSURE).stdout)
    pins = {canonical(name): version for name, version in PINS.items()}
    assert found["installed"] == {**pins, "normserve": "0.1.0"}
    assert set(found["closure"]) == set(pins), "requirements-serve.txt is not the closure of pyproject.toml's"
    for module in ("pip", "torch"):
        out = engine("run", "--rm", image, "python", "-c", f"import {module}", check=False)
        assert out.returncode == 1 and f"No module named '{module}'" in out.stderr


@pytest.fixture(scope="module")
def served(image: str) -> Iterator[Container]:
    with container("serve") as box:
        yield box


@pytest.mark.slow
def test_container_normalizes_seed_003_over_http(served: Container) -> None:
    r = httpx.post(served.base + "/normalize", json={"data": [[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]]}, timeout=10)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["output"], seed_003_reference(), atol=ATOL)


@pytest.mark.slow
def test_container_normalizes_seed_003_over_grpc(served: Container) -> None:
    client = grpcclient.InferenceServerClient(served.grpc)
    try:
        assert client.is_server_ready()
        x = grpcclient.InferInput("input", [2, 3], "FP32")
        x.set_data_from_numpy(np.asarray(SEED003.x, np.float32))
        result = client.infer("layernorm", [x])
    finally:
        client.close()
    np.testing.assert_allclose(result.as_numpy("output"), seed_003_reference(), atol=ATOL)


@pytest.mark.slow
def test_container_runs_as_uid_10001_on_a_read_only_root_with_a_writable_tmp(served: Container) -> None:
    ids = engine("exec", served.name, "sh", "-c", "id -u; id -g").stdout.split()
    assert ids == ["10001", "10001"]
    # As root too: the root filesystem itself is read-only, not only closed to the user.
    out = engine("exec", "--user", "0", served.name, "touch", "/srv/models/x", check=False)
    assert (out.returncode, out.stderr.strip()) == (1, "touch: cannot touch '/srv/models/x': Read-only file system")
    engine("exec", served.name, "touch", "/tmp/x")


@pytest.mark.slow
def test_healthcheck_passes_on_the_servers_port(served: Container) -> None:
    if not PODMAN:
        pytest.skip("`healthcheck run` is podman's")
    out = engine("healthcheck", "run", served.name, check=False)
    assert out.returncode == 0, out.stdout + out.stderr + logs(served.name)


# ---- podman stop under load ----------------------------------------------------------------------------------


def stop_when_accepted(box: Container, load: Load) -> tuple[float, subprocess.Popen[bytes]]:
    """`stop` (SIGTERM, SIGKILL after 40 s) once every client's long request is in the server."""
    start = time.monotonic()
    while time.monotonic() - start < 1 or not load.all_accepted():
        assert time.monotonic() - start < 60, "the load never had every client's request in the server"
        time.sleep(0.01)
    stop = subprocess.Popen([require_engine(), "stop", "-t", "40", box.name], stdout=subprocess.DEVNULL, env=env())
    load.stop = True
    return time.monotonic(), stop


@pytest.mark.slow
def test_stop_under_load_answers_every_accepted_request_and_exits_0(image: str) -> None:
    body, headers = encoder_request(32)  # long enough at one thread that all 4 are in the server at once
    with container("drain", ONE_THREAD) as box:
        load = Load(box.base, body, headers, clients=4)
        running = threading.Thread(target=asyncio.run, args=(load.run(),))
        running.start()
        t_stop, stop = stop_when_accepted(box, load)
        running.join(timeout=90)
        assert stop.wait(timeout=60) == 0
        stopped = time.monotonic()
        exit_code = int(engine("inspect", "--format", "{{.State.ExitCode}}", box.name).stdout)
        accepted = [c for c in load.calls if c.sent < t_stop]
        in_flight = sum(c.done > t_stop for c in accepted)
        last = max(c.done for c in accepted) - t_stop
        print(
            f"\ndrain: {len(accepted)} accepted, {in_flight} in flight at the stop, last answer after {last:.2f} s,"
            f" stopped after {stopped - t_stop:.2f} s, exit code {exit_code}"
        )
        assert [(c.status, c.error) for c in accepted] == [(200, None)] * len(accepted), logs(box.name)
        assert in_flight == 4, "the requests in flight at the stop were drained"
        assert exit_code == 0, logs(box.name)


# ---- poll mode on a read-only bind mount -----------------------------------------------------------------------


@pytest.fixture
def repository() -> Iterator[Path]:
    """A repository holding layernorm version 1, readable by the container's uid (pytest's tmp_path is not)."""
    path = Path(tempfile.mkdtemp(prefix="normserve-repo-"))
    try:
        path.chmod(0o755)
        readable_copy(MODELS / "layernorm", path / "layernorm")
        yield path
    finally:
        shutil.rmtree(path)


@pytest.mark.slow
def test_poll_mode_serves_a_version_written_on_the_host_within_seconds(image: str, repository: Path) -> None:
    environment = {"NORMSERVE_MODEL_DIR": "/mnt/models", "NORMSERVE_MODEL_CONTROL": "poll",
                   "NORMSERVE_POLL_INTERVAL_S": "1"}  # fmt: skip
    with container("poll", environment, ["-v", f"{repository}:/mnt/models:ro"]) as box:
        assert httpx.get(box.base + "/v2/models/layernorm/versions/2/ready").status_code == 404
        # As the exporter writes a version: whole, under a hidden name, then renamed into place.
        shutil.copytree(repository / "layernorm" / "1", repository / "layernorm" / ".2")
        (repository / "layernorm" / ".2").rename(repository / "layernorm" / "2")
        written = time.monotonic()
        while httpx.get(box.base + "/v2/models/layernorm/versions/2/ready").status_code != 200:
            assert time.monotonic() - written < 20, logs(box.name)
            time.sleep(0.1)
        print(f"\npoll: version 2 ready {time.monotonic() - written:.2f} s after it was written")
        v2 = {"inputs": [{"name": "input", "shape": [2, 3], "datatype": "FP32", "data": sum(SEED003.x, ())}]}
        r = httpx.post(box.base + "/v2/models/layernorm/versions/2/infer", json=v2)
        assert r.status_code == 200 and r.json()["model_version"] == "2", r.text
        np.testing.assert_allclose(r.json()["outputs"][0]["data"], seed_003_reference().ravel(), atol=ATOL)


# ---- traces to an OTLP receiver on the host --------------------------------------------------------------------


@pytest.mark.slow
def test_tracing_exports_a_requests_spans_to_a_receiver_on_the_host(image: str) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with otlp_receiver() as receiver, container("trace", tracing_env(receiver)) as box:
        headers = {"traceparent": f"00-{trace_id}-{parent}-01"}
        r = httpx.post(box.base + "/normalize", json={"data": [[0.2, 0.1, 0.3]]}, headers=headers)
        assert r.status_code == 200
        server, *stages = receiver.trace(trace_id, 5)
    assert (server.name, server.parent_span_id) == ("POST /normalize", parent)
    assert [s.name for s in stages] == ["queue", "decode", "inference", "encode"]
    assert server.resource["service.name"] == "normserve"
