"""app/server/api/v2/http/openapi.py: the infer document's binary header and its examples, one per model."""

from __future__ import annotations

import json

from app.server.api.v2.http import codec, openapi
from tests.live_server import MODELS


def test_infer_documents_the_binary_header_length_in_the_request_and_the_answer() -> None:
    (header,) = openapi.V2_INFER["openapi_extra"]["parameters"]
    assert (header["name"], header["in"]) == (codec.HEADER_LENGTH, "header")
    assert list(openapi.V2_INFER["responses"][200]["headers"]) == [codec.HEADER_LENGTH]


def test_infer_has_one_example_body_per_model_of_the_repository_naming_only_its_inputs() -> None:
    examples = openapi.V2_INFER["openapi_extra"]["requestBody"]["content"]["application/json"]["examples"]
    served = {json.loads(p.read_text())["name"] for p in MODELS.glob("*/1/manifest.json")}
    assert set(examples) == served
    for example in examples.values():
        assert example["value"]["inputs"][0]["name"] == "input"
