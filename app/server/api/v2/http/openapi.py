"""OpenAPI of the Open Inference Protocol's HTTP routes: infer bodies, metadata, statistics, repository."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.core.seeds import SEED003
from app.server.api.openapi import errors, ok
from app.server.api.v2.http.codec import HEADER_LENGTH
from app.server.api.v2.schemas import ref


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
        **errors(400, 404, 408, 413, 415, 503, 504, v2=True),
    },
}
V2_SERVER: dict[str, Any] = {
    "responses": ok("server name, version and the protocol extensions it supports", "v2_server_metadata")
}
V2_ALL_STATS: dict[str, Any] = {"responses": ok("Triton's statistics of every model", "v2_statistics")}
V2_METADATA: dict[str, Any] = {
    "responses": {**ok("the model's inputs and outputs", "v2_model_metadata"), **errors(400, 404, 503, v2=True)}
}
V2_READY: dict[str, Any] = {"responses": {**ok("the model is ready", "v2_readiness"), **errors(400, 404, 503, v2=True)}}
V2_STATS: dict[str, Any] = {
    "responses": {**ok("Triton's statistics of the model", "v2_statistics"), **errors(400, 404, 503, v2=True)}
}
V2_MONITOR: dict[str, Any] = {
    "responses": {
        200: {
            "description": "The LayerNorm drift monitor (psi, samples, baseline, live bins per LayerNorm)",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        **errors(400, 404, 503, v2=True),
    }
}
_OBJECT = {"content": {"application/json": {"schema": {"type": "object"}}}}
V2_CONFIG: dict[str, Any] = {
    "responses": {200: {"description": "Triton's model configuration", **_OBJECT}, **errors(400, 404, 503, v2=True)}
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
        **errors(400, 401, 403, v2=True),
    },
}
V2_REPOSITORY_CONTROL: dict[str, Any] = {
    **_REPOSITORY_BODY,
    "responses": {
        200: {"description": "done: the versions now serving, or unloaded", **_OBJECT},
        **errors(400, 401, 403, 404, v2=True),
    },
}
