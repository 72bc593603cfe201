"""app/server/api/rest/openapi.py: the /normalize and /encode documents say what the REST codec accepts."""

from __future__ import annotations

from typing import Any

import pytest

from app.server.api.rest import codec, openapi


def _schema(route: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = route["openapi_extra"]["requestBody"]["content"]["application/json"]["schema"]
    return schema


@pytest.mark.parametrize(
    ("route", "tensors", "params"),
    [
        (openapi.NORMALIZE, codec.NORMALIZE_TENSORS, codec.NormalizeParams),
        (openapi.ENCODE, codec.ENCODE_TENSORS, codec.EncodeParams),
    ],
    ids=["normalize", "encode"],
)
def test_a_body_documents_exactly_the_fields_the_codec_accepts_tensors_first(
    route: dict[str, Any], tensors: tuple[str, ...], params: Any
) -> None:
    fields = [f.alias or name for name, f in params.model_fields.items()]
    assert list(_schema(route)["properties"]) == [*tensors, *fields]
    assert _schema(route)["required"] == ["data"]


@pytest.mark.parametrize("route", [openapi.NORMALIZE, openapi.ENCODE], ids=["normalize", "encode"])
def test_every_example_body_holds_data_and_only_documented_fields(route: dict[str, Any]) -> None:
    examples = route["openapi_extra"]["requestBody"]["content"]["application/json"]["examples"]
    assert examples
    for example in examples.values():
        assert "data" in example["value"] and set(example["value"]) <= set(_schema(route)["properties"])
