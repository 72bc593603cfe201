"""OpenAPI for the raw-body routes: request schemas, the seeds' worked examples, and the error responses."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.core import reference
from app.core.seeds import SEED000, SEED003, SEED003_LAST_TWO_DIMS
from app.server.api.rest.codec import TENSOR_DOC, EncodeParams, NormalizeParams

_NESTED = {"type": "array", "items": {}, "description": TENSOR_DOC}
_ERROR = {"content": {"application/json": {"schema": {"type": "object", "properties": {"error": {"type": "string"}}}}}}


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


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    meaning = {
        400: "body is not valid JSON",
        404: "unknown model",
        413: "body larger than NORMSERVE_MAX_BODY_BYTES",
        415: "Content-Type is not application/json",
        422: "invalid tensor or field; the message names the field",
        503: "not ready, draining, or over NORMSERVE_MAX_IN_FLIGHT (with Retry-After)",
        504: "inference took longer than NORMSERVE_REQUEST_TIMEOUT_S",
    }
    return {s: {"description": meaning[s], **_ERROR} for s in statuses}


# Every V2 route (400 where REST answers 422, as Triton does); FastAPI's own 422 never reaches a V2 client.
V2_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "invalid body, tensor, parameter or header; the message names the field", **_ERROR},
    **_errors(404, 413, 503, 504),
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
            "content": {"application/json": {"example": _example_response()}},
        },
        **_errors(400, 413, 415, 422, 503, 504),
    },
}

ENCODE: dict[str, Any] = {
    "openapi_extra": _body(
        EncodeParams,
        {"data": _NESTED, "padding_mask": {"type": "array", "items": {}, "description": "bools [batch, seq]"}},
        {
            "two-positions": {
                "summary": "a [1, 2, 128] batch, second position padded",
                "value": {"data": [[[0.1] * 128, [0.2] * 128]], "padding_mask": [[False, True]]},
            }
        },
    ),
    "responses": {
        200: {"description": "encoder output and each LayerNorm's input statistics, in execution order"},
        **_errors(400, 404, 413, 415, 422, 503, 504),
    },
}
