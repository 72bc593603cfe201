"""app/server/api/v2/schemas.py: the protocol's bodies as JSON Schema, checked against the protocol's own client.

What tritonclient sends must be valid under the request schemas, what the models report under the
metadata schema, and every reference in the app's document must resolve. That normserve's answers
match the response schemas is checked on every answer of tests/suites/test_fuzz.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from jsonschema import Draft202012Validator

from app.core.runtime import Runtime
from app.core.tensors import DATATYPES
from app.main import create_app
from app.server.api.v2.schemas import COMPONENTS, DATATYPE


def validator(name: str) -> Draft202012Validator:
    """A validator of one component, whose references resolve among the components."""
    return Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": {"schemas": COMPONENTS}})


@pytest.mark.parametrize("name", sorted(COMPONENTS))
def test_each_component_is_a_valid_json_schema(name: str) -> None:
    Draft202012Validator.check_schema(COMPONENTS[name])


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def test_every_reference_of_the_app_document_resolves_to_a_component() -> None:
    doc = create_app().openapi()
    found = set(refs(doc))
    assert found, "the document refers to no component"
    assert {r.removeprefix("#/components/schemas/") for r in found} <= set(doc["components"]["schemas"])


def test_the_datatypes_are_the_protocols() -> None:
    assert DATATYPE["enum"] == [*DATATYPES, "BYTES"]


def tritonclient_bodies() -> Iterator[Any]:
    """Request bodies tritonclient builds: JSON tensors, and the JSON header of binary ones."""
    x = np.asarray([[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]], dtype=np.float32)
    for binary in (False, True):
        tensor = triton.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        outputs = [triton.InferRequestedOutput("output", binary_data=binary), triton.InferRequestedOutput("mean")]
        body, header_length = triton.InferenceServerClient.generate_request_body(
            [tensor], outputs, request_id="42", parameters={"eps": 1e-5, "eps_mode": "var"}
        )
        head = body if header_length is None else body[:header_length]
        yield pytest.param(json.loads(head), id="binary" if binary else "json")


@pytest.mark.parametrize("body", list(tritonclient_bodies()))
def test_what_tritonclient_sends_is_a_valid_inference_request(body: dict[str, Any]) -> None:
    if "data" not in body["inputs"][0]:  # binary: the protocol's JSON object has data; the extension moves it
        body["inputs"][0]["data"] = []
    assert list(validator("v2_inference_request").iter_errors(body)) == []


def test_the_documented_infer_examples_are_valid_inference_requests() -> None:
    operation = create_app().openapi()["paths"]["/v2/models/{name}/infer"]["post"]
    examples = operation["requestBody"]["content"]["application/json"]["examples"]
    assert sorted(examples) == ["encoder", "encoder-preln", "layernorm"]
    for example in examples.values():
        assert list(validator("v2_inference_request").iter_errors(example["value"])) == []


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"inputs": [{"name": "input", "shape": [3], "datatype": "FP33", "data": [1, 2, 3]}]}, "datatype"),
        ({"inputs": [{"name": "input", "shape": [3], "datatype": "FP32"}]}, "data"),
        ({"inputs": [{"name": "input", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}], "id": 42}, "id"),
        ({"inputs": [], "parameters": {"eps": [1e-5]}}, "eps"),
        ({"outputs": [{"name": "output"}]}, "inputs"),
    ],
    ids=["unknown-datatype", "no-data", "id-not-a-string", "parameter-not-a-scalar", "no-inputs"],
)
def test_the_request_schema_refuses_what_the_protocol_refuses(body: dict[str, Any], where: str) -> None:
    errors = list(validator("v2_inference_request").iter_errors(body))
    assert errors and where in str(errors[0].path) + errors[0].message


def test_every_models_metadata_is_valid_model_metadata(runtime: Runtime) -> None:
    assert [m.name for m in runtime.models] == ["encoder", "encoder-preln", "layernorm"]
    for model in runtime.models:
        assert list(validator("v2_model_metadata").iter_errors(model.metadata)) == []
