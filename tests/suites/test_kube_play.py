"""`podman kube play` on deploy/k8s/: the Deployment's pod runs from the built image, its probes pass, it serves.

podman is not a cluster, and the shipped files stay as a cluster needs them; the variant played is made here:
- the image: the tag this test run built (the shipped `normserve:latest` is what a cluster pulls);
- the host's network: free ports of 127.0.0.1 in NORMSERVE_HOST/PORT/GRPC_PORT/GRPC_HEALTH_PORT and the probes, and no
  containerPorts (podman refuses port mappings on the host's network);
- one replica: two pods on one host network would share ports;
- names of this run for the Deployment and the claim (podman makes the claim a volume of that name);
- the initContainer run by the test, as a kubelet runs it (to its end, before the pod, with its command, env,
  user, read-only root and no capabilities, on the claim), and the Deployment played without it: podman 4.3
  removes a kube play's init container without waiting for its end and then fails the whole play at times
  ("cannot remove container ... as it is running"), and ignores the annotation that would keep it.
The kinds podman plays are those below; the Service, HorizontalPodAutoscaler and PodDisruptionBudget are a
cluster's (docs/operations.md lists what a real cluster checks that podman does not).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from app.core import reference
from app.core.seeds import SEED003
from benchmarks.servers import free_port
from tests.containers import IMAGE, PREFIX, engine, logs, require_podman, wait_ready
from tests.live_server import ROOT

pytestmark = pytest.mark.slow

K8S = ROOT / "deploy" / "k8s"
# podman 4.3 makes a Secret a podman secret, then cannot read it back into an env (`secret ... is not valid JSON`):
# the variant takes a secretKeyRef's value from the shipped Secret instead.
PLAYED = {"Deployment", "PersistentVolumeClaim", "ConfigMap"}
NAME, CLAIM = f"{PREFIX}-k8s", f"{PREFIX}-models"
POD_CONTAINER = f"{NAME}-pod-0-normserve"  # podman names a Deployment's pods NAME-pod-N, their containers -NAME


def shipped() -> list[dict[str, Any]]:
    return [d for p in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def environment(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container["env"]}


def secret_value(ref: dict[str, Any]) -> str | None:
    """A secretKeyRef's value from the Secrets shipped; None for an optional one that none ships (an operator's)."""
    found = [d for d in shipped() if d["kind"] == "Secret" and d["metadata"]["name"] == ref["name"]]
    if not found and ref.get("optional"):
        return None
    (secret,) = found
    if ref["key"] in secret.get("stringData", {}):
        return str(secret["stringData"][ref["key"]])
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def inline_secrets(container: dict[str, Any]) -> None:
    """secretKeyRefs as literal values; a missing optional Secret leaves its variable unset, as in a cluster."""
    env = []
    for entry in container.get("env", []):
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            value = secret_value(ref)
            if value is None:
                continue
            entry = {"name": entry["name"], "value": value}
        env.append(entry)
    if "env" in container:
        container["env"] = env


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def variant(port: int, grpc_port: int, health_port: int) -> list[dict[str, Any]]:
    """The shipped documents podman plays, changed only as the module's docstring says."""
    docs = [d for d in shipped() if d["kind"] in PLAYED]
    for doc in docs:
        if doc["kind"] == "PersistentVolumeClaim":
            doc["metadata"]["name"] = CLAIM
        if doc["kind"] != "Deployment":
            continue
        doc["metadata"]["name"], doc["spec"]["replicas"] = NAME, 1
        pod = pod_spec(doc)
        for container in pod["initContainers"] + pod["containers"]:
            container["image"] = f"localhost/{IMAGE}"
            inline_secrets(container)
        for volume in pod["volumes"]:
            if "persistentVolumeClaim" in volume:
                volume["persistentVolumeClaim"]["claimName"] = CLAIM
        (server,) = pod["containers"]
        env = environment(server)
        for key, value in (
            ("NORMSERVE_HOST", "127.0.0.1"),
            ("NORMSERVE_PORT", port),
            ("NORMSERVE_GRPC_PORT", grpc_port),
            ("NORMSERVE_GRPC_HEALTH_PORT", health_port),
        ):
            env[key]["value"] = str(value)
        del server["ports"]
        for probe in ("startupProbe", "livenessProbe"):
            server[probe]["httpGet"]["port"] = port
        server["readinessProbe"]["grpc"]["port"] = health_port
    return docs


def run_init_container(init: dict[str, Any], volumes: dict[str, str]) -> str:
    """The initContainer to its end, as the kubelet runs it before the pod's containers: its output."""
    sc = init["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
    flags = ["--user", "10001:10001", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    flags += [f"--env={e['name']}={e['value']}" for e in init["env"]]
    flags += [f"-v={volumes[m['name']]}:{m['mountPath']}" for m in init["volumeMounts"]]
    command = init["command"]
    return engine(
        "run", "--rm", "--network", "none", *flags, "--entrypoint", command[0], init["image"], *command[1:]
    ).stdout


@pytest.fixture(scope="module")
def played(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The claim played, the initContainer run on it, then the Deployment played on the host's network: the pod's
    HTTP base and the address of its gRPC readiness probe (NORMSERVE_GRPC_HEALTH_PORT). Everything is removed at the end by its name."""
    require_podman()
    port, grpc_port, health_port = free_port(), free_port(), free_port()
    folder = tmp_path_factory.mktemp("kube")
    docs = variant(port, grpc_port, health_port)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = pod_spec(deployment)
    (init,) = pod.pop("initContainers")
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v
    }
    first, then = folder / "claims.yaml", folder / "deployment.yaml"
    # ConfigMaps go with the Deployment: podman resolves a configMapKeyRef within the file it plays.
    first.write_text(yaml.safe_dump_all([d for d in docs if d["kind"] == "PersistentVolumeClaim"]))
    then.write_text(yaml.safe_dump_all([d for d in docs if d["kind"] != "PersistentVolumeClaim"]))
    try:
        engine("kube", "play", str(first))
        assert "seed: layernorm copied" in run_init_container(init, claims)
        engine("kube", "play", "--network", "host", str(then), timeout=300)
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, POD_CONTAINER)
        yield base, f"127.0.0.1:{health_port}"
    finally:
        engine("kube", "down", str(then), check=False)
        engine("volume", "rm", "-f", CLAIM, check=False)


def probes() -> dict[str, dict[str, Any]]:
    (deployment,) = [d for d in shipped() if d["kind"] == "Deployment"]
    (server,) = deployment["spec"]["template"]["spec"]["containers"]
    return {name: server[name] for name in ("startupProbe", "livenessProbe", "readinessProbe")}


@pytest.mark.parametrize("probe", ["startupProbe", "livenessProbe"])
def test_the_deployments_http_probes_pass_on_the_played_pod(played: tuple[str, str], probe: str) -> None:
    # As the kubelet probes: a GET of the probe's path on the pod's port, from outside the container.
    r = httpx.get(played[0] + probes()[probe]["httpGet"]["path"], timeout=probes()[probe].get("timeoutSeconds", 1))
    assert r.status_code == 200, r.text


def test_the_deployments_grpc_readiness_probe_passes_on_the_played_pod(played: tuple[str, str]) -> None:
    # The kubelet's gRPC probe: grpc.health.v1 Check with the probe's service ("" when it names none).
    service = probes()["readinessProbe"]["grpc"].get("service", "")
    with grpc.insecure_channel(played[1]) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=3)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_the_played_pod_serves_seed_003_from_the_seeded_claim(played: tuple[str, str]) -> None:
    r = httpx.post(played[0] + "/normalize", json={"data": [list(row) for row in SEED003.x]}, timeout=10)
    assert r.status_code == 200, r.text + logs(POD_CONTAINER)
    want = reference.layer_norm(np.asarray(SEED003.x, np.float32), eps=SEED003.eps).output
    np.testing.assert_allclose(r.json()["output"], want, atol=1e-5)
    # The initContainer copied the image's three models into the claim, which the server reads at /mnt/models.
    listing = engine("volume", "inspect", "--format", "{{.Mountpoint}}", CLAIM).stdout.strip()
    assert sorted(p.name for p in Path(listing).iterdir()) == ["encoder", "encoder-preln", "layernorm"]
    for name in ("encoder", "encoder-preln", "layernorm"):
        assert httpx.get(f"{played[0]}/v2/models/{name}/ready", timeout=10).status_code == 200, name


def test_the_played_pod_runs_as_the_manifests_user_read_only_without_capabilities(played: tuple[str, str]) -> None:
    fields = "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}} {{len .EffectiveCaps}} {{.HostConfig.Memory}}"
    assert engine("inspect", "--format", fields, POD_CONTAINER).stdout.split() == [
        "10001:10001",
        "true",
        "0",
        str(2**31),
    ]
