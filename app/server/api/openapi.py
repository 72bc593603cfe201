"""OpenAPI for the raw-body routes: request and response schemas, the seeds' worked examples, every status.

The routes read raw bodies (no pydantic on the hot path), so FastAPI cannot infer their documents: each
route's dict here says what it takes and every status it may answer; the V2 bodies are the protocol's
(app/server/api/v2/schemas.py). tests/suites/test_fuzz.py fuzzes a live server from this document.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import FastAPI

from app.core import reference
from app.core.seeds import SEED000, SEED003, SEED003_LAST_TWO_DIMS
from app.server.api.rest.codec import TENSOR_DOC, EncodeParams, NormalizeParams
from app.server.api.v2.http.codec import HEADER_LENGTH
from app.server.api.v2.schemas import COMPONENTS, ref

_NESTED = {"type": "array", "items": {}, "description": TENSOR_DOC}
_ERROR = {"content": {"application/json": {"schema": ref("error")}}}


def _body(params: type, tensors: dict[str, Any], examples: dict[str, Any]) -> dict[str, Any]:
    schema = params.model_json_schema(by_alias=True)  # type: ignore[attr-defined]
    schema["properties"] = {**tensors, **schema["properties"]}
    schema["required"] = ["data"]
    schema.pop("title", None)
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema, "examples": examples}},
        }
    }


_MEANING = {
    400: "body is not valid JSON",
    401: "no `Authorization: Bearer <token>`, or more than one, while NORMSERVE_ADMIN_TOKEN is set",
    403: "NORMSERVE_ADMIN_TOKEN not set (admin routes closed), a wrong admin token, or model control that is not "
    "explicit (the message names the setting)",
    404: "unknown model or version",
    408: "the body did not arrive within NORMSERVE_BODY_TIMEOUT_S; the connection is closed",
    413: "body larger than NORMSERVE_MAX_BODY_BYTES, also after decompression",
    415: "Content-Type is not JSON, or Content-Encoding is neither gzip nor deflate",
    422: "invalid tensor or field; the message names the field",
    503: "not ready, draining, or over NORMSERVE_MAX_IN_FLIGHT",
    504: "inference took longer than NORMSERVE_REQUEST_TIMEOUT_S",
}
# V2 answers 400 where REST answers 422, as Triton does; its bodies are read whatever their Content-Type.
_V2_MEANING = {
    **_MEANING,
    400: "invalid body, tensor, parameter, header, model name or version; the message names the field",
    415: "Content-Encoding is neither gzip nor deflate",
}
_RETRY_AFTER = {"Retry-After": {"required": True, "description": "seconds", "schema": {"type": "integer"}}}


def _errors(*statuses: int, v2: bool = False) -> dict[int | str, dict[str, Any]]:
    meaning = _V2_MEANING if v2 else _MEANING
    return {
        s: {"description": meaning[s], **_ERROR, **({"headers": _RETRY_AFTER} if s == 503 else {})} for s in statuses
    }


def _example_response() -> dict[str, Any]:
    """What POST /normalize answers for seed 003's example, from the float64 reference (output to 7 decimals)."""
    r = reference.layer_norm(np.asarray(SEED003.x), SEED003.k, SEED003.eps, SEED003.eps_mode)
    return {
        "output": (np.round(r.output, 7) + 0.0).tolist(),  # + 0.0: no -0.0
        "shape": list(r.output.shape),
        "stats": {"mean": r.mean.tolist(), "var": r.var.tolist(), "std": np.sqrt(r.var).tolist()},
        "backend": "onnxruntime",
        "model": {"name": "layernorm", "version": "1", "sha256": "..."},
    }


_NORMALIZE_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["output", "shape", "stats", "backend", "model"],
    "properties": {
        "output": {"description": "data normalized over its last k dims: data's shape"},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "stats": {"type": "object", "description": "mean, var and std (float64) of each row of data: data.shape[:-k]"},
        "backend": {"type": "string", "enum": ["onnxruntime", "numpy"]},
        "model": {"description": "the model that answered (name, version, sha256); null from the numpy backend"},
        "validation": {"type": "object", "description": "with validate: true, the other backend's max_abs_diff"},
        "warnings": {
            "type": "array",
            "items": {"type": "string"},
            "description": "present only when there is one: rows of data whose distinct values all round to the "
            "same float32, so that their var is 0 and their normalized values are 0",
        },
    },
}

NORMALIZE: dict[str, Any] = {
    "openapi_extra": _body(
        NormalizeParams,
        {"data": _NESTED, "gamma": _NESTED, "beta": _NESTED},
        {
            "seed003": {"summary": "seed 003: two words, three dims (eps 1e-5, mode var)", "value": SEED003.request()},
            "seed003-last-two-dims": {
                "summary": "seeds 002/003: normalized_shape [1, 3] of a [2, 1, 3] input",
                "value": SEED003_LAST_TWO_DIMS.request(),
            },
            "seed000": {
                "summary": "seed 000: sigma + eps (eps_mode std, eps 1e-6)",
                "value": {**SEED000.request(), "validate": True},
            },
        },
    ),
    "responses": {
        200: {
            "description": "normalized output and per-row statistics",
            "content": {"application/json": {"schema": _NORMALIZE_ANSWER, "example": _example_response()}},
        },
        **_errors(400, 404, 408, 413, 415, 422, 503, 504),
    },
}

_ENCODE_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["output", "shape", "layer_norms", "model"],
    "properties": {
        "output": {"type": "array", "description": "data's shape, float32 numbers"},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "layer_norms": {
            "type": "array",
            "items": {"type": "object", "required": ["name", "mean", "std"], "description": "[batch, seq] or [seq]"},
        },
        "model": {"type": "object", "required": ["name", "version", "sha256"]},
        "validation": {"type": "object", "description": "with validate: true, the NumPy reference's max_abs_diff"},
    },
}

ENCODE: dict[str, Any] = {
    "openapi_extra": _body(
        EncodeParams,
        {
            "data": _NESTED,
            "padding_mask": {"type": ["array", "null"], "items": {}, "description": "bools [batch, seq]; null: none"},
        },
        {
            "two-positions": {
                "summary": "a [1, 2, 128] batch, second position padded",
                "value": {"data": [[[0.1] * 128, [0.2] * 128]], "padding_mask": [[False, True]]},
            }
        },
    ),
    "responses": {
        200: {
            "description": "encoder output and each LayerNorm's input statistics, in execution order",
            "content": {"application/json": {"schema": _ENCODE_ANSWER}},
        },
        **_errors(400, 404, 408, 413, 415, 422, 503, 504),
    },
}


def _ok(description: str, schema: str) -> dict[int | str, dict[str, Any]]:
    return {200: {"description": description, "content": {"application/json": {"schema": ref(schema)}}}}


def _v2_examples() -> dict[str, Any]:
    """One infer body per served model, keyed by its name (tests/suites/test_fuzz.py posts each to its model)."""
    x = np.asarray(SEED003.x, dtype=np.float32)
    seed003 = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}
    two = {"name": "input", "shape": [1, 2, 128], "datatype": "FP32", "data": [0.1] * 128 + [0.2] * 128}
    mask = {"name": "padding_mask", "shape": [1, 2], "datatype": "BOOL", "data": [False, True]}
    encoder = {"id": "42", "inputs": [two, mask], "outputs": [{"name": "output"}]}
    return {
        "layernorm": {"summary": "layernorm: seed 003, two words of three features", "value": {"inputs": [seed003]}},
        "encoder": {"summary": "encoder: a [1, 2, 128] batch, second position padded", "value": encoder},
        "encoder-preln": {"summary": "encoder-preln: the same batch", "value": encoder},
    }


_BINARY = {"type": "string", "format": "binary"}
_LENGTH_DOC = "bytes of the JSON header that starts the body; binary tensors follow it (Triton's binary extension)"

V2_INFER: dict[str, Any] = {
    "openapi_extra": {
        "parameters": [
            {
                "name": HEADER_LENGTH,
                "in": "header",
                "schema": {"type": "integer", "minimum": 0},
                "description": _LENGTH_DOC,
            }
        ],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": ref("v2_inference_request"), "examples": _v2_examples()},
                "application/octet-stream": {"schema": _BINARY, "description": "the JSON header, then binary inputs"},
            },
        },
    },
    "responses": {
        200: {
            "description": "the outputs; with binary outputs, the JSON header and then each binary output's bytes",
            "headers": {HEADER_LENGTH: {"description": _LENGTH_DOC, "schema": {"type": "integer"}}},
            "content": {
                "application/json": {"schema": ref("v2_inference_response")},
                "application/octet-stream": {"schema": _BINARY},
            },
        },
        **_errors(400, 404, 408, 413, 415, 503, 504, v2=True),
    },
}
V2_SERVER: dict[str, Any] = {
    "responses": _ok("server name, version and the protocol extensions it supports", "v2_server_metadata")
}
V2_ALL_STATS: dict[str, Any] = {"responses": _ok("Triton's statistics of every model", "v2_statistics")}
V2_METADATA: dict[str, Any] = {
    "responses": {**_ok("the model's inputs and outputs", "v2_model_metadata"), **_errors(400, 404, 503, v2=True)}
}
V2_READY: dict[str, Any] = {
    "responses": {**_ok("the model is ready", "v2_readiness"), **_errors(400, 404, 503, v2=True)}
}
V2_STATS: dict[str, Any] = {
    "responses": {**_ok("Triton's statistics of the model", "v2_statistics"), **_errors(400, 404, 503, v2=True)}
}
_OBJECT = {"content": {"application/json": {"schema": {"type": "object"}}}}
V2_CONFIG: dict[str, Any] = {
    "responses": {200: {"description": "Triton's model configuration", **_OBJECT}, **_errors(400, 404, 503, v2=True)}
}
_STRING = {"type": "string"}
_STATE = {"type": "string", "enum": ["READY", "UNAVAILABLE", "LOADING", "UNLOADING"]}
_ROW: dict[str, Any] = {
    "type": "object",
    "required": ["name", "version", "state", "reason"],
    "properties": {"name": _STRING, "version": _STRING, "state": _STATE, "reason": _STRING},
}
_INDEX = {"content": {"application/json": {"schema": {"type": "array", "items": _ROW}}}}
_REPOSITORY_BODY = {
    "openapi_extra": {"requestBody": {"required": False, **_OBJECT, "description": '{"parameters": {...}}'}}
}
V2_REPOSITORY_INDEX: dict[str, Any] = {
    **_REPOSITORY_BODY,
    "responses": {
        200: {"description": "every version in the folder and every one serving, with its state", **_INDEX},
        **_errors(400, 401, 403, v2=True),
    },
}
V2_REPOSITORY_CONTROL: dict[str, Any] = {
    **_REPOSITORY_BODY,
    "responses": {
        200: {"description": "done: the versions now serving, or unloaded", **_OBJECT},
        **_errors(400, 401, 403, 404, v2=True),
    },
}
HEALTH_LIVE: dict[str, Any] = {"responses": _ok("the process serves", "v2_liveness")}
HEALTH_READY: dict[str, Any] = {
    "responses": {
        **_ok("every model verified, and not draining", "v2_readiness"),
        503: {"description": "models not verified yet, or draining: the reason", **_ERROR, "headers": _RETRY_AFTER},
    }
}


def install(app: FastAPI) -> None:
    """The app's document as FastAPI builds it, plus the protocol's schemas, less the 422 FastAPI adds itself.

    FastAPI documents a `{"detail": ...}` 422 on every route with parameters; no route answers it
    (DirectRoute validates nothing, and app/server/api/errors.py answers `{"error": ...}`)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        fresh = app.openapi_schema is None
        doc = build()  # FastAPI's, built once and then cached in app.openapi_schema
        if fresh:
            _amend(doc)
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def _amend(doc: dict[str, Any]) -> None:
    for item in doc["paths"].values():
        for operation in item.values():
            if "HTTPValidationError" in str(operation.get("responses", {}).get("422")):
                del operation["responses"]["422"]
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    components.update(COMPONENTS)
