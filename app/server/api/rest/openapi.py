"""OpenAPI of POST /normalize and POST /encode: their bodies, the seeds' worked examples, every status."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.core import reference
from app.core.seeds import SEED000, SEED003, SEED003_LAST_TWO_DIMS
from app.server.api.openapi import errors
from app.server.api.rest.codec import TENSOR_DOC, EncodeParams, NormalizeParams

_NESTED = {"type": "array", "items": {}, "description": TENSOR_DOC}


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
            "same float32 (or, with dtype, the same float16 or bfloat16), so that their var is 0 and their normalized "
            "values are 0",
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
        **errors(400, 404, 408, 413, 415, 422, 503, 504),
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
        **errors(400, 404, 408, 413, 415, 422, 503, 504),
    },
}
