"""OpenAPI of /v1/embeddings, /v1/models and /tokenize: their bodies, their answers and every status, with errors
in OpenAI's shape."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from app.server.api.openai.codec import EmbeddingsParams, TokenizeParams

_MEANING = {
    400: "invalid body, field, text or token id; the message names it (input[3], dimensions, model, ...)",
    404: "unknown model",
    408: "the body did not arrive within NORMSERVE_BODY_TIMEOUT_S; the connection is closed",
    413: "body larger than NORMSERVE_MAX_BODY_BYTES, or texts over NORMSERVE_MAX_REQUEST_TOKENS",
    415: "Content-Type is not JSON, or Content-Encoding is neither gzip nor deflate",
    503: "not ready, draining, or over NORMSERVE_MAX_IN_FLIGHT",
    504: "inference took longer than NORMSERVE_REQUEST_TIMEOUT_S",
}
_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_RETRY_AFTER = {"Retry-After": {"required": True, "description": "seconds", "schema": {"type": "integer"}}}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {
        s: {
            "description": _MEANING[s],
            "content": {"application/json": {"schema": _ERROR}},
            **({"headers": _RETRY_AFTER} if s == 503 else {}),
        }
        for s in statuses
    }


def _body(params: type[BaseModel], example: dict[str, Any]) -> dict[str, Any]:
    schema = params.model_json_schema()
    schema.pop("title", None)
    content = {"application/json": {"schema": schema, "example": example}}
    return {"requestBody": {"required": True, "content": content}}


def _answer(description: str, schema: dict[str, Any]) -> dict[int | str, dict[str, Any]]:
    return {200: {"description": description, "content": {"application/json": {"schema": schema}}}}


EMBEDDINGS: dict[str, Any] = {
    "openapi_extra": _body(EmbeddingsParams, {"model": "minilm", "input": ["A sentence.", "Another one."]}),
    "responses": {
        **_answer(
            "OpenAI's list of embeddings, with the tokens run as usage",
            {
                "type": "object",
                "required": ["object", "data", "model", "usage"],
                "properties": {
                    "object": {"const": "list"},
                    "data": {
                        "type": "array",
                        "items": {"type": "object", "required": ["object", "index", "embedding"]},
                    },
                    "model": {"type": "string"},
                    "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"]},
                },
            },
        ),
        **_errors(400, 404, 408, 413, 415, 503, 504),
    },
}
MODELS: dict[str, Any] = {
    "responses": _answer(
        "the text encoders serving, as OpenAI lists models",
        {"type": "object", "required": ["object", "data"], "properties": {"data": {"type": "array"}}},
    )
}
TOKENIZE: dict[str, Any] = {
    "openapi_extra": _body(TokenizeParams, {"model": "minilm", "input": "A sentence."}),
    "responses": {
        **_answer(
            "each text's ids and tokens as the model runs them",
            {"type": "object", "required": ["model", "data", "usage"], "properties": {"data": {"type": "array"}}},
        ),
        **_errors(400, 404, 408, 413, 415, 503, 504),
    },
}
