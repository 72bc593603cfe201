"""deploy/ and docker-compose.yml: the Kubernetes manifests against the schemas kubernetes-validate ships, the
KServe ServingRuntime and InferenceService, and where each of them finds the model repository."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from starlette.routing import Match

from app.core.repository import FORMAT_VERSION, MANIFEST, Repository
from app.main import app
from app.settings import Settings
from tests.live_server import ROOT

# A Kubernetes version whose schemas kubernetes-validate ships (nothing is downloaded); strict = unknown fields fail.
K8S_VERSION = "1.32.0"
K8S_DIR = ROOT / "deploy" / "k8s"
ISVC = ROOT / "deploy" / "kserve" / "inferenceservice.yaml"
RUNTIME = ROOT / "deploy" / "kserve" / "servingruntime.yaml"
COMPOSE = ROOT / "docker-compose.yml"
KSERVE_MODEL_DIR = "/mnt/models"  # where KServe's storage initializer mounts or downloads a storageUri
# The image's own repository (the Dockerfile's ENV), which the seed copies from.
(IMAGE_MODEL_DIR,) = re.findall(r"NORMSERVE_MODEL_DIR=(\S+)", (ROOT / "Dockerfile").read_text())
# KServe's ComponentExtensionSpec: the predictor's keys that are not part of its inline PodSpec.
KSERVE_EXTENSION_KEYS = {
    "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "containerConcurrency", "timeout",
    "canaryTrafficPercent", "logger", "batcher", "labels", "annotations", "deploymentStrategy",
}  # fmt: skip
# KServe's ModelSpec: the keys of predictor.model beside the Container fields it inlines.
KSERVE_MODEL_KEYS = {"modelFormat", "runtime", "protocolVersion", "storageUri"}
# KServe's ServingRuntimeSpec: the keys that are not part of its inline PodSpec.
KSERVE_RUNTIME_KEYS = {
    "supportedModelFormats", "protocolVersions", "multiModel", "disabled", "grpcEndpoint", "grpcDataEndpoint",
    "httpDataEndpoint", "replicas", "storageHelper", "builtInAdapter", "workerSpec", "labels", "annotations",
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
    """The variables given a value in the manifest (those from a Secret: secret_env)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def secret_env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container.get("env", []) if "valueFrom" in e}


def container_port(container: dict[str, Any], name: str | int) -> int:
    """A probe's or Service's port, resolved through the container's named ports."""
    if isinstance(name, int):
        return name
    ports: dict[str, int] = {p["name"]: p["containerPort"] for p in container["ports"] if "name" in p}
    return ports[name]


def as_pod(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "normserve"}, "spec": spec}


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


@pytest.fixture(scope="module")
def pod() -> dict[str, Any]:
    spec: dict[str, Any] = manifest("Deployment")["spec"]["template"]["spec"]
    return spec


@pytest.fixture(scope="module")
def seed(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any]
    (container,) = pod["initContainers"]
    return container


@pytest.fixture(scope="module")
def runtime() -> dict[str, Any]:
    doc: dict[str, Any]
    (doc,) = docs(RUNTIME)
    assert doc["apiVersion"] == "serving.kserve.io/v1alpha1" and doc["kind"] == "ServingRuntime"
    return doc


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


def test_readiness_is_the_grpc_health_check_on_the_probes_own_port(pod: dict[str, Any]) -> None:
    # grpc.health.v1 with service "" (the whole server): SERVING exactly when GET /v2/health/ready is 200. On the
    # port of probes only, which connections filling the gRPC port cannot keep a probe from (issue 37, D7).
    (container,) = pod["containers"]
    probe = container["readinessProbe"]["grpc"]
    assert "service" not in probe
    env = env_of(container)
    port = int(env["NORMSERVE_GRPC_HEALTH_PORT"])
    assert probe["port"] == port == container_port(container, "grpc-health") == 8002
    assert int(env["NORMSERVE_GRPC_PORT"]) == container_port(container, "grpc") == 8001


def test_deployment_runs_as_the_images_non_root_user_on_a_read_only_root(pod: dict[str, Any]) -> None:
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    # The only writable mount is the in-memory /tmp; the repository is read-only.
    writable = [path for path, m in mounts(container).items() if not m.get("readOnly")]
    assert writable == ["/tmp"]
    assert "emptyDir" in {v["name"]: v for v in pod["volumes"]}[mounts(container)["/tmp"]["name"]]
    assert {"requests", "limits"} <= container["resources"].keys()


# ---- Kubernetes: the model repository on a PersistentVolumeClaim ---------------------------------------------


def test_repository_claim_is_read_write_many_for_every_replica() -> None:
    pvc = manifest("PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"]


def test_deployment_mounts_the_claim_read_only_at_the_model_dir(pod: dict[str, Any]) -> None:
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = mounts(container)[env_of(container)["NORMSERVE_MODEL_DIR"]]
    assert mount["readOnly"] is True
    claim = volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
    assert claim == manifest("PersistentVolumeClaim")["metadata"]["name"]


def test_deployment_polls_the_repository_so_new_versions_roll_out_without_a_restart(pod: dict[str, Any]) -> None:
    env = env_of(pod["containers"][0])
    assert env["NORMSERVE_MODEL_CONTROL"] == "poll"
    # Seconds, not minutes, to a new version; not so often that a pod stats the volume without pause.
    assert 1 <= float(env["NORMSERVE_POLL_INTERVAL_S"]) <= 60


def test_seed_writes_the_claim_from_the_images_models_as_the_pods_user(
    pod: dict[str, Any], seed: dict[str, Any]
) -> None:
    (container,) = pod["containers"]
    env = env_of(seed)
    assert seed["image"] == container["image"]  # the models it copies are the ones baked into this image
    assert env["SEED_FROM"] == IMAGE_MODEL_DIR == "/srv/models"
    mount = mounts(seed)[env["SEED_INTO"]]
    assert not mount.get("readOnly") and mount["name"] == mounts(container)["/mnt/models"]["name"]
    # fsGroup: the volume's group is the image's user's, who may then write it without root.
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"] == 10001
    sc = seed["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and {"requests", "limits"} <= seed["resources"].keys()


def test_seed_copies_under_a_hidden_name_then_renames_without_clobbering(seed: dict[str, Any]) -> None:
    shell, flag, script = seed["command"]
    assert (shell, flag) == ("sh", "-c")
    assert '[ -e "$SEED_INTO/$name" ]' in script  # an existing model is skipped before anything is copied
    assert 'tmp="$SEED_INTO/.seed-' in script and 'cp -R "$src" "$tmp"' in script  # hidden: the server skips it
    assert 'mv -T "$tmp" "$SEED_INTO/$name"' in script  # -T: never into, or over, a non-empty folder
    assert "rm -rf" not in script.replace('rm -rf "$tmp"', "")  # nothing but its own temporary copy is removed
    # Kubernetes expands $(NAME) in a command itself: the script's $(...) must be shell only.
    assert not re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", script)


def _run_seed(seed: dict[str, Any], source: Path, target: Path) -> str:
    shell, flag, script = seed["command"]
    env = {"PATH": "/usr/bin:/bin", "SEED_FROM": str(source), "SEED_INTO": str(target)}
    out = subprocess.run([shell, flag, script], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_seed_fills_an_empty_claim_and_never_touches_an_existing_model(seed: dict[str, Any], tmp_path: Path) -> None:
    source, target = tmp_path / "image", tmp_path / "claim"
    for name in ("layernorm", "encoder"):
        (source / name / "1").mkdir(parents=True)
        (source / name / "1" / MANIFEST).write_text(f"image {name}")
    target.mkdir()
    (target / "encoder" / "3").mkdir(parents=True)  # a user's own encoder, exported into the claim
    (target / "encoder" / "3" / MANIFEST).write_text("mine")

    first = _run_seed(seed, source, target)
    assert "layernorm copied" in first and "encoder is there, kept" in first
    assert (target / "layernorm" / "1" / MANIFEST).read_text() == "image layernorm"
    assert sorted(p.name for p in (target / "encoder").iterdir()) == ["3"]
    assert (target / "encoder" / "3" / MANIFEST).read_text() == "mine"
    assert sorted(p.name for p in target.iterdir()) == ["encoder", "layernorm"]  # no temporary copy left behind

    (target / "layernorm" / "1" / MANIFEST).write_text("changed since")  # a second pod's start: nothing to do
    assert "copied" not in _run_seed(seed, source, target)
    assert (target / "layernorm" / "1" / MANIFEST).read_text() == "changed since"


@pytest.mark.parametrize("which", ["deployment", "servingruntime"])
def test_every_normserve_variable_is_a_setting_with_a_valid_value(
    pod: dict[str, Any], runtime: dict[str, Any], which: str
) -> None:
    container = pod["containers"][0] if which == "deployment" else runtime["spec"]["containers"][0]
    env = {k: v for k, v in env_of(container).items() if k.startswith("NORMSERVE_")}
    fields = {name.removeprefix("NORMSERVE_").lower(): value for name, value in env.items()}
    unknown = fields.keys() - Settings.model_fields.keys()
    assert not unknown, f"not settings: {sorted(unknown)}"
    settings = Settings.model_validate(fields)  # pydantic parses the strings as the service will
    assert settings.port == 8000 and settings.drain_timeout_s == 30
    # Both serve the volume where it is mounted (KServe's path for a storageUri), and follow it.
    assert str(settings.model_dir) == KSERVE_MODEL_DIR and settings.model_control == "poll"


@pytest.mark.parametrize("which", ["deployment", "servingruntime"])
def test_the_admin_token_comes_from_a_secret_never_from_the_manifest(
    pod: dict[str, Any], runtime: dict[str, Any], which: str
) -> None:
    container = pod["containers"][0] if which == "deployment" else runtime["spec"]["containers"][0]
    assert "NORMSERVE_ADMIN_TOKEN" not in env_of(container)
    # optional: without the Secret the pods start, and the admin routes stay closed (403)
    assert secret_env(container) == {
        "NORMSERVE_ADMIN_TOKEN": {"name": "normserve-admin", "key": "token", "optional": True}
    }


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


# ---- KServe: the ServingRuntime and the InferenceService that uses it -------------------------------------------


@pytest.fixture(scope="module")
def predictor() -> dict[str, Any]:
    (isvc,) = docs(ISVC)
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    spec: dict[str, Any] = isvc["spec"]["predictor"]
    return spec


def test_runtime_offers_the_normserve_format_as_kserve_runtimes_do(
    runtime: dict[str, Any], pod: dict[str, Any]
) -> None:
    spec = runtime["spec"]
    (fmt,) = spec["supportedModelFormats"]
    assert fmt == {"name": "normserve", "version": str(FORMAT_VERSION), "autoSelect": True}
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"  # the container KServe merges the model spec into
    assert container["image"] == pod["containers"][0]["image"]
    assert container["ports"] == [{"name": "http1", "containerPort": 8000, "protocol": "TCP"}]


def test_runtime_lists_grpc_v2_only_when_it_declares_the_grpc_port(runtime: dict[str, Any]) -> None:
    # Knative routes the declared port only: the protocols offered are those that port speaks.
    (container,) = runtime["spec"]["containers"]
    grpc_port = int(env_of(container).get("NORMSERVE_GRPC_PORT", Settings.model_fields["grpc_port"].default))  # 0: off
    declared = {p["containerPort"] for p in container["ports"] if p["name"] == "h2c"}
    assert "v2" in runtime["spec"]["protocolVersions"]
    assert ("grpc-v2" in runtime["spec"]["protocolVersions"]) == (grpc_port in declared)


@pytest.mark.parametrize(
    ("probe", "path"), [("readinessProbe", "/v2/health/ready"), ("livenessProbe", "/v2/health/live")]
)
def test_runtime_probes_hit_the_v2_health_routes(runtime: dict[str, Any], probe: str, path: str) -> None:
    (container,) = runtime["spec"]["containers"]
    get = container[probe]["httpGet"]
    assert (get["path"], get["port"]) == (path, 8000)
    assert routed(path)


def test_runtime_pod_spec_is_a_valid_kubernetes_pod_spec(runtime: dict[str, Any]) -> None:
    """The runtime inlines a PodSpec: with KServe's own keys removed, the rest must be a valid Pod's spec."""
    assert runtime["spec"].keys() & KSERVE_RUNTIME_KEYS  # the formats and protocols are there
    spec = {k: v for k, v in runtime["spec"].items() if k not in KSERVE_RUNTIME_KEYS}
    assert kubernetes_validate.validate(as_pod(spec), K8S_VERSION, strict=True) == "1.32"


def test_runtime_runs_as_the_images_non_root_user_on_a_read_only_root(runtime: dict[str, Any]) -> None:
    (container,) = runtime["spec"]["containers"]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert list(mounts(container)) == ["/tmp"]  # KServe adds /mnt/models itself, read-only


def test_inferenceservice_uses_the_runtime_on_the_repository_claim(
    predictor: dict[str, Any], runtime: dict[str, Any]
) -> None:
    # A custom `containers:` list would bypass the runtime: the predictor holds the model spec only.
    assert predictor.keys() - KSERVE_EXTENSION_KEYS == {"model"}
    model = predictor["model"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["protocolVersion"] == "v2" and model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert model["storageUri"] == f"pvc://{manifest('PersistentVolumeClaim')['metadata']['name']}/"


def test_inferenceservice_limits_match_the_runtimes_settings(
    predictor: dict[str, Any], runtime: dict[str, Any]
) -> None:
    env = env_of(runtime["spec"]["containers"][0])
    assert predictor["containerConcurrency"] == int(env["NORMSERVE_MAX_IN_FLIGHT"])  # the queue never overfills a pod
    assert predictor["timeout"] == float(env["NORMSERVE_REQUEST_TIMEOUT_S"])


def test_inferenceservice_model_spec_is_a_valid_container_override(predictor: dict[str, Any]) -> None:
    """Beside KServe's keys, predictor.model inlines a Container: a misspelled key (storageURI) would fail here."""
    assert predictor["model"].keys() >= KSERVE_MODEL_KEYS
    overrides = {k: v for k, v in predictor["model"].items() if k not in KSERVE_MODEL_KEYS}
    container = {"name": "kserve-container", "image": "normserve:latest", **overrides}
    kubernetes_validate.validate(as_pod({"containers": [container]}), K8S_VERSION, strict=True)
    broken = {**container, "storageURI": predictor["model"]["storageUri"]}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(as_pod({"containers": [broken]}), K8S_VERSION, strict=True)


# ---- docker compose ------------------------------------------------------------------------------------------------


def test_compose_replicas_poll_the_hosts_models_folder_read_only() -> None:
    service = yaml.safe_load(COMPOSE.read_text())["x-normserve"]
    env = service["environment"]
    (volume,) = service["volumes"]
    assert (volume["type"], volume["source"], volume["read_only"]) == ("bind", "./models", True)
    assert volume["target"] == env["NORMSERVE_MODEL_DIR"] and env["NORMSERVE_MODEL_CONTROL"] == "poll"
    assert volume["bind"]["create_host_path"] is False  # a missing folder fails the start, not the requests
    # The admin token from a file kept out of git; without it the admin routes are closed.
    assert "NORMSERVE_ADMIN_TOKEN" not in env
    assert service["env_file"] == [{"path": "./normserve-admin.env", "required": False}]
    assert "normserve-admin.env" in (ROOT / ".gitignore").read_text().splitlines()
    # What the replicas then serve: the checkout's repository, the image's three models.
    repository = Repository(ROOT / volume["source"])
    assert repository.names() == ["encoder", "encoder-preln", "layernorm"]


REST_BYTES = 384 * 2**20  # a worker at rest with the shipped models, with room (132 MiB measured: docs/reliability.md)
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def quantity(value: str) -> int:
    """A Kubernetes memory quantity in bytes (the binary suffixes the manifests use, or plain bytes)."""
    for suffix, scale in UNITS.items():
        if value.endswith(suffix):
            return int(float(value.removesuffix(suffix)) * scale)
    return int(value)


@pytest.mark.parametrize("which", ["deployment", "servingruntime"])
def test_the_memory_limit_holds_every_worker_at_its_budget(
    pod: dict[str, Any], runtime: dict[str, Any], which: str
) -> None:
    """docs/operations.md: limit >= workers x (REST_BYTES + 4 x NORMSERVE_MAX_INFLIGHT_BYTES), set explicitly."""
    container = pod["containers"][0] if which == "deployment" else runtime["spec"]["containers"][0]
    env = env_of(container)
    fields = {name.removeprefix("NORMSERVE_").lower(): v for name, v in env.items() if name.startswith("NORMSERVE_")}
    settings = Settings.model_validate(fields)
    assert "NORMSERVE_MAX_INFLIGHT_BYTES" in env  # the budget the limit was sized from is the one the pod runs
    limit = quantity(container["resources"]["limits"]["memory"])
    assert settings.workers * (REST_BYTES + 4 * settings.max_inflight_bytes) <= limit


@pytest.mark.parametrize(("value", "expected"), [("2Gi", 2**31), ("512Mi", 2**29), ("64Ki", 65536), ("1000", 1000)])
def test_quantity_reads_kubernetes_memory(value: str, expected: int) -> None:
    assert quantity(value) == expected
