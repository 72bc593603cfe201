"""schemathesis on normserve's own /openapi.json against a live server: never a 5xx, every answer as documented.

Every operation of the document runs in schemathesis' coverage phase (its deterministic cases: each
keyword's boundaries, one mutation at a time, the methods the path does not take) and its fuzzing
phase (hypothesis, derandomized, a bounded number of examples), positive and negative. Path
parameters are free strings (unknown models: a documented 404) and, for every model-scoped route,
each served model at version 1, so that generated bodies reach the codecs. Then each documented
infer example is posted to its model, and a binary request to layernorm: each a 200 as documented,
with the reference's values. Over the whole module the server's own request counter must show no
5xx, whichever check sent the request.

Every schemathesis check runs but one: "schema-valid data is accepted" (positive_data_acceptance).
JSON Schema cannot say what a valid tensor is (rectangular, its element count its shape's, a known
input name, 128 wide for the encoders, within float32): an empty `inputs` list is schema-valid and
rightly a 400. Those refusals are documented 4xx that name the field, which the other checks (no
5xx, documented statuses, content types, headers and bodies, schema-violating data refused) cover.

CI runs EXAMPLES per operation, mode and path; `-m slow` runs SLOW_EXAMPLES.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from app.core import reference
from app.core.seeds import SEED003
from app.main import create_app

MODELS = ("layernorm", "encoder", "encoder-preln")
EXAMPLES = 20  # fuzzing cases per operation, mode and path: the whole document in about 20 s on 2 shared cores
SLOW_EXAMPLES = 300
COVERAGE_CASES = 300  # coverage cases per operation and path, at most (the phase is deterministic: a bound)
EXCLUDED = [positive_data_acceptance]
DOCUMENT = create_app().openapi()


def path_variants(path: str) -> list[dict[str, str] | None]:
    """None (schemathesis generates the path parameters), then each served model at version 1."""
    if "{name}" not in path:
        return [None]
    fixed = [{"name": m, "version": "1"} for m in MODELS]
    return [None, *({k: v for k, v in f.items() if "{" + k + "}" in path} for f in fixed)]


def _id(label: str, mode: str, path: dict[str, str] | None) -> str:
    return f"{label}-{mode}-{path['name'] if path else 'any-name'}"


def cases(modes: Callable[[dict[str, Any]], list[str]]) -> list[Any]:
    out = []
    for path, item in DOCUMENT["paths"].items():
        for method, spec in item.items():
            label = f"{method.upper()} {path}"
            for variant, mode in itertools.product(path_variants(path), modes(spec)):
                out.append(pytest.param(label, mode, variant, id=_id(label, mode, variant)))
    return out


def fuzz_modes(spec: dict[str, Any]) -> list[str]:
    """Negative cases need something to violate: a body or a typed header (path parameters are free strings)."""
    violable = "requestBody" in spec or any(p["in"] == "header" for p in spec.get("parameters", []))
    return ["positive", "negative"] if violable else ["positive"]


def answered(client: httpx.Client) -> Counter[str]:
    """The server's own count of its answers by status (normserve_http_requests_total), /metrics excluded."""
    counts: Counter[str] = Counter()
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("normserve_http_requests_total{") and 'route="/metrics"' not in line:
            counts[line.split('status="')[1].split('"')[0]] += int(float(line.rsplit(" ", 1)[1]))
    return counts


@pytest.fixture(scope="module")
def live_schema(server: str, client: httpx.Client) -> Iterator[Any]:
    """The live document; afterwards, every answer the server gave meanwhile, by status: no 5xx among them."""
    before = answered(client)
    yield schemathesis.openapi.from_url(f"{server}/openapi.json")
    during = answered(client) - before
    print(f"\nfuzz: {sum(during.values())} answers, by status: {dict(sorted(during.items()))}")
    assert not [status for status in during if status.startswith("5")], during


def operation(live_schema: Any, label: str) -> Any:
    found = live_schema.find_operation_by_label(label)
    assert found is not None, f"{label} is in the app but not in the live /openapi.json"
    return found


def fuzz(live_schema: Any, label: str, mode: str, path: dict[str, str] | None, examples: int) -> None:
    strategy = operation(live_schema, label).as_strategy(generation_mode=GenerationMode(mode), path_parameters=path)

    @given(case=strategy)
    @settings(
        max_examples=examples,
        derandomize=True,  # the same cases on every run: a CI failure reproduces
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def run(case: schemathesis.Case) -> None:
        case.call_and_validate(timeout=30, excluded_checks=EXCLUDED)

    hypothesis_test: Callable[[], None] = run
    hypothesis_test()


@pytest.mark.parametrize(("label", "mode", "path"), cases(fuzz_modes))
def test_fuzzed_requests_never_5xx_and_are_answered_as_documented(
    live_schema: Any, label: str, mode: str, path: dict[str, str] | None
) -> None:
    fuzz(live_schema, label, mode, path, EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize(("label", "mode", "path"), cases(fuzz_modes))
def test_fuzzed_requests_at_length_never_5xx_and_are_answered_as_documented(
    live_schema: Any, label: str, mode: str, path: dict[str, str] | None
) -> None:
    fuzz(live_schema, label, mode, path, SLOW_EXAMPLES)


@pytest.mark.parametrize(("label", "mode", "path"), cases(lambda spec: ["both"]))
def test_coverage_cases_never_5xx_and_are_answered_as_documented(
    live_schema: Any, label: str, mode: str, path: dict[str, str] | None
) -> None:
    op = operation(live_schema, label)
    config = live_schema.config.generation_for(operation=op, phase="coverage")
    modes = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
    sent = 0
    for case in itertools.islice(
        live_schema.iter_coverage_cases(op, generation_modes=modes, generation_config=config), COVERAGE_CASES
    ):
        if path is not None and case.method.upper() == op.method.upper():
            case.path_parameters = {**(case.path_parameters or {}), **path}
        case.call_and_validate(timeout=30, excluded_checks=EXCLUDED)
        sent += 1
    assert sent > 0


INFER = "POST /v2/models/{name}/versions/{version}/infer"


def expected_outputs(model: str, body: dict[str, Any], runtime: Any) -> dict[str, np.ndarray]:
    """The reference's outputs for a documented example: layernorm's output, or the encoder's."""
    data = body["inputs"][0]
    x = np.asarray(data["data"], dtype=np.float32).reshape(data["shape"])
    if model == "layernorm":
        return {"output": reference.layer_norm(x, SEED003.k, SEED003.eps, SEED003.eps_mode).output}
    m = runtime.get(model)
    mask = np.asarray(body["inputs"][1]["data"], dtype=bool).reshape(body["inputs"][1]["shape"])
    return {"output": reference.encoder(x, m.weights, m.config, mask)[0]}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("label", [INFER, INFER.replace("/versions/{version}", "")])
def test_documented_infer_examples_are_answered_right_and_as_documented(
    live_schema: Any, runtime: Any, label: str, model: str
) -> None:
    op = operation(live_schema, label)
    content = DOCUMENT["paths"][op.path]["post"]["requestBody"]["content"]["application/json"]
    body = content["examples"][model]["value"]
    case = op.Case(path_parameters={"name": model, "version": "1"}, body=body, media_type="application/json")
    response = case.call_and_validate(timeout=30, excluded_checks=EXCLUDED)
    assert response.status_code == 200, response.text
    doc = response.json()
    for name, want in expected_outputs(model, body, runtime).items():
        got = next(o for o in doc["outputs"] if o["name"] == name)
        np.testing.assert_allclose(np.asarray(got["data"]).reshape(want.shape), want, atol=1e-4)


def test_a_binary_infer_request_is_answered_as_documented(live_schema: Any, client: httpx.Client) -> None:
    op = operation(live_schema, INFER)
    x = np.asarray(SEED003.x, dtype=np.float32)
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
    head = httpx.Request("POST", "/", json={"inputs": [tensor], "parameters": {"binary_data_output": True}}).content
    case = op.Case(
        path_parameters={"name": "layernorm", "version": "1"},
        headers={"Inference-Header-Content-Length": str(len(head))},
        body=head + x.tobytes(),
        media_type="application/octet-stream",
    )
    response = case.call_and_validate(timeout=30, excluded_checks=EXCLUDED)
    assert response.status_code == 200 and response.headers["content-type"] == ["application/octet-stream"]
    split = int(response.headers["inference-header-content-length"][0])
    output = np.frombuffer(response.content[split:][: x.nbytes], dtype=np.float32).reshape(x.shape)
    np.testing.assert_allclose(output, reference.layer_norm(x).output, atol=1e-4)
