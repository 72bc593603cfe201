"""The Open Inference Protocol's HTTP bodies as JSON Schema: documentation in normserve's OpenAPI, never a parser.

Written from the protocol's definitions (kserve/open-inference-protocol, specification/protocol:
the REST binding's request, response, tensor and parameter objects, server and model metadata,
readiness), and Triton's statistics extension for the stats routes. Objects stay open where the
protocol leaves them open (no `additionalProperties: false`): what normserve refuses beyond the
protocol (an unknown field or parameter) is a documented 400 naming it, so the documents say what
any client of the protocol may send, and fuzzing from them (tests/suites/test_fuzz.py) reaches
every route. The routes still read raw bodies (app/server/api/v2/http/codec.py): nothing here parses.
"""

from __future__ import annotations

from typing import Any

from app.core.tensors import DATATYPES

_REF = "#/components/schemas/"
# The protocol's tensor datatypes: Triton's numeric ones (app/core/tensors.py) and BYTES (a text encoder's texts).
DATATYPE = {"type": "string", "enum": [*DATATYPES, "BYTES"]}


def ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional field that normserve also takes as null, read as absent (KServe's own server does the same)."""
    return {"anyOf": [schema, {"type": "null"}], "description": "null: as if absent"}


_STRINGS = {"type": "array", "items": {"type": "string"}}
_SHAPE = {"type": "array", "items": {"type": "integer"}}
_DURATION = _object(["count", "ns"], count={"type": "integer"}, ns={"type": "integer"})

COMPONENTS: dict[str, Any] = {
    "v2_parameters": {
        "type": "object",
        "description": "Parameters by name; each value a boolean, number or string. normserve's models take eps, "
        "eps_mode and normalized_ndim (layernorm); tritonclient's reserved names are accepted too; any other is a 400.",
        "additionalProperties": {"type": ["boolean", "number", "string"]},
    },
    "v2_tensor_data": {
        "type": "array",
        "description": "The tensor's elements in row-major order, flat or nested; only the count must match shape.",
        "items": {"anyOf": [ref("v2_tensor_data"), {"type": "number"}, {"type": "string"}, {"type": "boolean"}]},
    },
    "v2_request_input": _object(
        ["name", "shape", "datatype", "data"],
        name={"type": "string"},
        shape=_SHAPE,
        datatype=DATATYPE,
        parameters=_or_null(ref("v2_parameters")),
        data=ref("v2_tensor_data"),
    ),
    "v2_request_output": _object(["name"], name={"type": "string"}, parameters=_or_null(ref("v2_parameters"))),
    "v2_inference_request": _object(
        ["inputs"],
        id=_or_null({"type": "string", "description": "echoed in the response"}),
        model_name={"type": "string", "description": "as KServe's client sends it: must be the URL's model"},
        model_version={"type": "string", "description": "must be the version that serves the request; empty: any"},
        parameters=_or_null(ref("v2_parameters")),
        inputs={"type": "array", "items": ref("v2_request_input")},
        outputs=_or_null({"type": "array", "items": ref("v2_request_output"), "description": "none: every output"}),
    ),
    "v2_response_output": _object(
        ["name", "shape", "datatype", "data"],
        name={"type": "string"},
        shape=_SHAPE,
        datatype=DATATYPE,
        parameters=ref("v2_parameters"),
        data=ref("v2_tensor_data"),
    ),
    "v2_inference_response": _object(
        ["model_name", "outputs"],
        model_name={"type": "string"},
        model_version={"type": "string"},
        id={"type": "string"},
        parameters=ref("v2_parameters"),
        outputs={"type": "array", "items": ref("v2_response_output")},
    ),
    "error": _object(["error"], error={"type": "string", "description": "`<field>: <what was expected>`"}),
    "v2_server_metadata": _object(
        ["name", "version", "extensions"], name={"type": "string"}, version={"type": "string"}, extensions=_STRINGS
    ),
    "v2_metadata_tensor": _object(
        ["name", "datatype", "shape"], name={"type": "string"}, datatype=DATATYPE, shape=_SHAPE
    ),
    "v2_model_metadata": _object(
        ["name", "platform"],
        name={"type": "string"},
        versions=_STRINGS,
        platform={"type": "string"},
        inputs={"type": "array", "items": ref("v2_metadata_tensor")},
        outputs={"type": "array", "items": ref("v2_metadata_tensor")},
    ),
    "v2_readiness": _object(
        ["ready"],
        name={"type": "string", "description": "the model's, on a model's readiness"},
        ready={"type": "boolean"},
        error={"type": "string", "description": "when not ready: why"},
    ),
    "v2_liveness": _object(["live"], live={"type": "boolean"}),
    "v2_statistics": _object(
        ["model_stats"],
        model_stats={
            "type": "array",
            "items": _object(
                ["name", "version", "inference_stats"],
                name={"type": "string"},
                version={"type": "string"},
                last_inference={"type": "integer", "description": "ms since the epoch; 0 before the first"},
                inference_count={"type": "integer"},
                execution_count={"type": "integer"},
                inference_stats={"type": "object", "additionalProperties": ref("v2_duration")},
                batch_stats={
                    "type": "array",
                    "items": {"type": "object", "properties": {"batch_size": {"type": "integer"}}},
                },
            ),
        },
    ),
    "v2_duration": _DURATION,
}
