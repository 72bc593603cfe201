"""deploy/: the Kubernetes manifests against the schemas kubernetes-validate ships, and the KServe InferenceService."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from starlette.routing import Match

from app.main import app
from app.settings import Settings
from tests.live_server import ROOT

# A Kubernetes version whose schemas kubernetes-validate ships (nothing is downloaded); strict = unknown fields fail.
K8S_VERSION = "1.32.0"
K8S_DIR = ROOT / "deploy" / "k8s"
ISVC = ROOT / "deploy" / "kserve" / "inferenceservice.yaml"
# KServe's ComponentExtensionSpec: the predictor's keys that are not part of its inline PodSpec.
KSERVE_EXTENSION_KEYS = {
    "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "containerConcurrency", "timeout",
    "canaryTrafficPercent", "logger", "batcher", "labels", "annotations", "deploymentStrategy",
}  # fmt: skip


def routed(path: str) -> bool:
    """Whether the app has a GET route for path (routers are matched as Starlette does, not listed)."""
    scope = {"type": "http", "method": "GET", "path": path, "root_path": "", "path_params": {}}
    return any(r.matches(scope)[0] == Match.FULL for r in app.router.routes)


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifest(kind: str) -> dict[str, Any]:
    found = [d for p in sorted(K8S_DIR.glob("*.yaml")) for d in docs(p) if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in {K8S_DIR}, found {len(found)}"
    return found[0]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def container_port(container: dict[str, Any], name: str | int) -> int:
    """A probe's or Service's port, resolved through the container's named ports."""
    if isinstance(name, int):
        return name
    ports: dict[str, int] = {p["name"]: p["containerPort"] for p in container["ports"] if "name" in p}
    return ports[name]


@pytest.fixture(scope="module")
def pod() -> dict[str, Any]:
    spec: dict[str, Any] = manifest("Deployment")["spec"]["template"]["spec"]
    return spec


# ---- Kubernetes: schema validity -------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(K8S_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_kubernetes_manifest_is_valid_against_the_pinned_schema(path: Path) -> None:
    documents = docs(path)
    assert documents, f"{path} holds no manifest"
    for doc in documents:
        assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == "1.32"


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [
        pytest.param(("spec", "template", "spec", "containers", 0), "readinesProbe", {}, id="misspelled-field"),
        pytest.param(("spec", "template", "spec"), "terminationGracePeriodSeconds", "45", id="string-for-integer"),
    ],
)
def test_strict_validation_rejects_a_broken_deployment(where: tuple[str | int, ...], key: str, value: Any) -> None:
    doc = copy.deepcopy(manifest("Deployment"))
    node: Any = doc
    for step in where:
        node = node[step]
    node[key] = value
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


# ---- Kubernetes: what the manifests promise ---------------------------------------------------------------


def test_grace_period_outlasts_the_prestop_sleep_plus_the_drain_timeout(pod: dict[str, Any]) -> None:
    (container,) = pod["containers"]
    drain = float(env_of(container)["NORMSERVE_DRAIN_TIMEOUT_S"])
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and 0 < float(command[1]) <= 10
    assert pod["terminationGracePeriodSeconds"] > drain + float(command[1])


@pytest.mark.parametrize(("probe", "path"), [("livenessProbe", "/v2/health/live"), ("startupProbe", "/v2/health/live")])
def test_deployment_probes_hit_the_apps_health_routes_on_its_port(pod: dict[str, Any], probe: str, path: str) -> None:
    (container,) = pod["containers"]
    get = container[probe]["httpGet"]
    assert get["path"] == path and routed(path)
    assert container_port(container, get["port"]) == 8000


def test_readiness_is_the_grpc_health_check_on_the_grpc_port(pod: dict[str, Any]) -> None:
    # grpc.health.v1 with service "" (the whole server): SERVING exactly when GET /v2/health/ready is 200.
    (container,) = pod["containers"]
    probe = container["readinessProbe"]["grpc"]
    assert "service" not in probe
    port = int(env_of(container)["NORMSERVE_GRPC_PORT"])
    assert probe["port"] == port == container_port(container, "grpc") == 8001


def test_deployment_runs_as_the_images_non_root_user_on_a_read_only_root(pod: dict[str, Any]) -> None:
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == "/tmp"
    assert "emptyDir" in {v["name"]: v for v in pod["volumes"]}[mount["name"]]
    assert {"requests", "limits"} <= container["resources"].keys()


@pytest.mark.parametrize("which", ["deployment", "inferenceservice"])
def test_every_normserve_variable_is_a_setting_with_a_valid_value(pod: dict[str, Any], which: str) -> None:
    container = pod["containers"][0] if which == "deployment" else docs(ISVC)[0]["spec"]["predictor"]["containers"][0]
    env = {k: v for k, v in env_of(container).items() if k.startswith("NORMSERVE_")}
    fields = {name.removeprefix("NORMSERVE_").lower(): value for name, value in env.items()}
    unknown = fields.keys() - Settings.model_fields.keys()
    assert not unknown, f"not settings: {sorted(unknown)}"
    settings = Settings(**fields)  # pydantic parses the strings as the service will
    assert settings.port == 8000 and settings.drain_timeout_s == 30


def test_route_check_can_fail() -> None:
    assert routed("/v2/health/ready") and not routed("/v2/health/readyz")


def test_service_sends_port_80_to_the_pods_port_8000_and_grpc_to_8001(pod: dict[str, Any]) -> None:
    svc = manifest("Service")
    labels = manifest("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["selector"].items() <= labels.items()
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert set(ports) == {"http", "grpc"}
    assert ports["http"]["port"] == 80 and container_port(pod["containers"][0], ports["http"]["targetPort"]) == 8000
    assert ports["grpc"]["port"] == 8001 and container_port(pod["containers"][0], ports["grpc"]["targetPort"]) == 8001
    assert ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"


def test_autoscaler_scales_the_deployment_on_cpu_utilization() -> None:
    hpa, deployment = manifest("HorizontalPodAutoscaler"), manifest("Deployment")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu" and metric["resource"]["target"]["type"] == "Utilization"
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert deployment["spec"]["replicas"] == hpa["spec"]["minReplicas"]


# ---- KServe InferenceService -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def predictor() -> dict[str, Any]:
    (isvc,) = docs(ISVC)
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    spec: dict[str, Any] = isvc["spec"]["predictor"]
    return spec


def test_inferenceservice_is_a_custom_predictor_speaking_v2(predictor: dict[str, Any], pod: dict[str, Any]) -> None:
    (container,) = predictor["containers"]
    assert container["name"] == "kserve-container"
    assert container["image"] == pod["containers"][0]["image"]
    assert env_of(container)["PROTOCOL"] == "v2"  # KServe's protocol switch for custom containers
    assert container["ports"] == [{"name": "http1", "containerPort": 8000, "protocol": "TCP"}]
    assert predictor["containerConcurrency"] == int(env_of(container)["NORMSERVE_MAX_IN_FLIGHT"])


@pytest.mark.parametrize(
    ("probe", "path"), [("readinessProbe", "/v2/health/ready"), ("livenessProbe", "/v2/health/live")]
)
def test_inferenceservice_probes_hit_the_v2_health_routes(predictor: dict[str, Any], probe: str, path: str) -> None:
    get = predictor["containers"][0][probe]["httpGet"]
    assert (get["path"], get["port"]) == (path, 8000)
    assert routed(path)


def test_inferenceservice_pod_spec_is_a_valid_kubernetes_pod_spec(predictor: dict[str, Any]) -> None:
    """The predictor inlines a PodSpec: with KServe's own keys removed, the rest must be a valid Pod's spec."""
    assert predictor.keys() & KSERVE_EXTENSION_KEYS  # scaling settings are there
    spec = {k: v for k, v in predictor.items() if k not in KSERVE_EXTENSION_KEYS}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "normserve-predictor"}, "spec": spec}
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
