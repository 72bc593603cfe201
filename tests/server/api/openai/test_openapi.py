"""openapi.py: the document a live server serves at /openapi.json describes POST /v1/embeddings, GET /v1/models and
POST /tokenize as the codec reads them (their fields, which are required, no others) and as the server answers
(its 200s' and its errors' shapes, in OpenAI's form). Which statuses each route documents is the status table's,
in tests/server/api/test_openapi.py."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from app.core.dataplane import ModelInfo
from app.core.textencoder import TextOutput
from app.server.api.openai import codec

ROUTES = {"POST /v1/embeddings": codec.EmbeddingsParams, "POST /tokenize": codec.TokenizeParams}


@pytest.fixture(scope="module")
def document(server: str) -> dict[str, Any]:
    answer = httpx.get(f"{server}/openapi.json", timeout=30)
    assert answer.status_code == 200
    doc: dict[str, Any] = answer.json()
    return doc


def operation(document: dict[str, Any], label: str) -> dict[str, Any]:
    method, path = label.split(" ", 1)
    op: dict[str, Any] = document["paths"][path][method.lower()]
    return op


def body_of(document: dict[str, Any], label: str) -> dict[str, Any]:
    body: dict[str, Any] = operation(document, label)["requestBody"]
    assert body["required"] is True
    media: dict[str, Any] = body["content"]["application/json"]
    return media


@pytest.mark.parametrize(("label", "params"), ROUTES.items())
def test_a_request_body_documents_exactly_the_fields_the_codec_reads(
    document: dict[str, Any], label: str, params: Any
) -> None:
    schema = body_of(document, label)["schema"]
    assert list(schema["properties"]) == list(params.model_fields)
    assert (schema["required"], schema["additionalProperties"]) == (["model", "input"], False)


@pytest.mark.parametrize(("label", "params"), ROUTES.items())
def test_a_request_bodys_example_is_one_the_codec_accepts(document: dict[str, Any], label: str, params: Any) -> None:
    example = body_of(document, label)["example"]
    assert codec.parse(params, orjson.dumps(example)).model_dump(include=set(example)) == example


def test_embeddings_documents_its_encoding_formats_and_defaults(document: dict[str, Any]) -> None:
    fields = body_of(document, "POST /v1/embeddings")["schema"]["properties"]
    assert fields["encoding_format"]["enum"] == ["float", "base64"]
    assert (fields["encoding_format"]["default"], fields["truncate"]["default"]) == ("float", True)
    assert fields["return_layer_norms"]["default"] is False


def test_models_takes_no_body_and_lists_what_the_server_answers(server: str, document: dict[str, Any]) -> None:
    op = operation(document, "GET /v1/models")
    assert "requestBody" not in op
    schema = op["responses"]["200"]["content"]["application/json"]["schema"]
    answer = httpx.get(f"{server}/v1/models", timeout=30)
    assert answer.status_code == 200
    assert set(schema["required"]) == set(answer.json())


def test_embeddings_200_documents_the_fields_of_the_codecs_answer(document: dict[str, Any]) -> None:
    output = TextOutput(np.ones((1, 2), dtype=np.float32), [], ModelInfo("m", "1", ""), [3])
    answer = orjson.loads(codec.encode_embeddings(codec.Wire("m", "float", 2, False), output))
    schema = operation(document, "POST /v1/embeddings")["responses"]["200"]["content"]["application/json"]["schema"]
    assert set(schema["required"]) == set(answer)
    assert schema["properties"]["data"]["items"]["required"] == list(answer["data"][0])
    assert schema["properties"]["usage"]["required"] == list(answer["usage"])


@pytest.mark.parametrize(
    ("label", "body", "status"),
    [
        ("POST /v1/embeddings", {"model": "nope", "input": "a"}, 404),
        ("POST /v1/embeddings", {"model": "layernorm", "input": "a"}, 400),
        ("POST /v1/embeddings", {"model": "layernorm", "input": "a", "size": 1}, 400),
        ("POST /tokenize", {"model": "nope", "input": "a"}, 404),
        ("POST /tokenize", {"model": "layernorm", "input": []}, 400),
    ],
)
def test_an_error_answers_as_its_status_documents_it(
    server: str, document: dict[str, Any], label: str, body: dict[str, Any], status: int
) -> None:
    documented = operation(document, label)["responses"][str(status)]["content"]["application/json"]["schema"]
    answer = httpx.post(f"{server}{label.split(' ', 1)[1]}", json=body, timeout=30)
    assert answer.status_code == status
    error = answer.json()
    assert list(error) == documented["required"] == ["error"]
    assert list(error["error"]) == documented["properties"]["error"]["required"]
