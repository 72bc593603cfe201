"""deploy/k8s/autoscaling/: the KEDA ScaledObject and the prometheus-adapter HPA recipe that scale on queue time.

The core kinds (HorizontalPodAutoscaler, ConfigMap) are validated by kubernetes-validate's schemas, the ScaledObject
by KEDA's published CRD schema kept beside it (nothing is downloaded); both refuse unknown fields. Their PromQL is
checked by promtool, and they must target the Deployment, keep hpa.yaml's bounds and CPU as the fallback.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.live_server import ROOT
from tests.suites.test_manifests import K8S_VERSION, docs, manifest

RECIPES = ROOT / "deploy" / "k8s" / "autoscaling"
KEDA_SCHEMA = RECIPES / "schemas" / "keda.sh_scaledobjects.v1alpha1.yaml"
SCALING_METRICS = {"normserve_queue_seconds", "normserve_pending_requests"}  # API.md section 13


def strict(schema: Any) -> Any:
    """The schema refusing unknown fields wherever it lists properties, as `kubectl --validate=strict` does."""
    if isinstance(schema, dict):
        out = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def keda_errors(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(strict(yaml.safe_load(KEDA_SCHEMA.read_text())))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def recipe(kind: str) -> dict[str, Any]:
    found = [d for p in sorted(RECIPES.glob("*.yaml")) for d in docs(p) if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in {RECIPES}, found {len(found)}"
    return found[0]


def adapter_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load(recipe("ConfigMap")["data"]["config.yaml"])["rules"]
    return rules


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_each_recipe_is_valid_against_its_published_schema(path: Path) -> None:
    for doc in docs(path):
        if doc["apiVersion"] == "keda.sh/v1alpha1":
            assert keda_errors(doc) == []
        else:
            assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == "1.32"


@pytest.mark.parametrize(
    ("where", "key", "value", "error"),
    [
        (("spec",), "minReplicas", 2, "spec: Additional properties are not allowed ('minReplicas' was unexpected)"),
        (("spec",), "maxReplicaCount", "10", "spec.maxReplicaCount: '10' is not of type 'integer'"),
        (("spec", "triggers", 0, "metadata"), "threshold", 0.05, "spec.triggers.0.metadata.threshold: 0.05 is not of type 'string'"),
    ],
    ids=["hpa-field-name", "string-for-integer", "number-for-string"],
)  # fmt: skip
def test_the_keda_schema_refuses_a_broken_scaledobject(
    where: tuple[str | int, ...], key: str, value: Any, error: str
) -> None:
    doc = copy.deepcopy(recipe("ScaledObject"))
    node: Any = doc
    for step in where:
        node = node[step]
    node[key] = value
    assert keda_errors(doc) == [error]


@pytest.mark.parametrize("kind", ["ScaledObject", "HorizontalPodAutoscaler"])
def test_each_recipe_scales_the_deployment_within_the_cpu_hpas_bounds(kind: str) -> None:
    scaler, deployment, cpu = recipe(kind), manifest("Deployment"), manifest("HorizontalPodAutoscaler")
    target = scaler["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    spec = scaler["spec"]
    bounds = (spec["minReplicaCount"], spec["maxReplicaCount"]) if kind == "ScaledObject" else (
        spec["minReplicas"], spec["maxReplicas"])  # fmt: skip
    assert bounds == (cpu["spec"]["minReplicas"], cpu["spec"]["maxReplicas"])
    behavior = (
        spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] if kind == "ScaledObject" else spec["behavior"]
    )
    assert behavior == cpu["spec"]["behavior"]


def test_keda_scales_on_queue_time_and_pending_requests_with_cpu_as_the_fallback() -> None:
    triggers = recipe("ScaledObject")["spec"]["triggers"]
    assert [t["type"] for t in triggers] == ["prometheus", "prometheus", "cpu"]
    queried = [set(re.findall(r"normserve_\w+?(?=_bucket|\{)", t["metadata"]["query"])) for t in triggers[:2]]
    assert queried == [{"normserve_queue_seconds"}, {"normserve_pending_requests"}]
    cpu = manifest("HorizontalPodAutoscaler")["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"]
    assert triggers[2]["metadata"] == {"value": str(cpu)}


def test_the_hpa_scales_on_the_adapters_metrics_with_cpu_as_the_fallback() -> None:
    metrics = recipe("HorizontalPodAutoscaler")["spec"]["metrics"]
    pods = [m["pods"]["metric"]["name"] for m in metrics if m["type"] == "Pods"]
    assert sorted(pods) == sorted(rule["name"]["as"] for rule in adapter_rules())
    assert {m["resource"]["name"] for m in metrics if m["type"] == "Resource"} == {"cpu"}
    for rule in adapter_rules():
        series = re.match(r"(\w+)\{", rule["seriesQuery"])
        assert series and re.sub(r"_bucket$", "", series[1]) in SCALING_METRICS
        assert rule["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"},
            "instance": {"resource": "pod"},
        }


def test_the_recipes_promql_parses(tmp_path: Path) -> None:
    """KEDA's queries and the adapter's queries (templates filled as the adapter fills them) as recording rules."""
    fill = {"<<.Series>>": "normserve_queue_seconds_bucket", "<<.LabelMatchers>>": 'namespace="default"',
            "<<.GroupBy>>": "instance"}  # fmt: skip
    queries = [t["metadata"]["query"] for t in recipe("ScaledObject")["spec"]["triggers"] if t["type"] == "prometheus"]
    for rule in adapter_rules():
        query = rule["metricsQuery"]
        for template, value in fill.items():
            query = query.replace(template, value)
        queries.append(query)
    rules = {
        "groups": [{"name": "recipes", "rules": [{"record": f"recipe:{i}", "expr": q} for i, q in enumerate(queries)]}]
    }
    (tmp_path / "recipes.yml").write_text(yaml.safe_dump(rules))
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs Debian's prometheus package (promtool)")
    result = subprocess.run([promtool, "check", "rules", "recipes.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0 and f"SUCCESS: {len(queries)} rules found" in result.stdout, result.stderr
