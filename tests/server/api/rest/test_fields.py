"""app/server/api/rest/fields.py: a REST body read as far as the model it names, its small fields checked and its
tensors found; what is wrong with the body at that point is a 4xx naming the field (whole messages)."""

from __future__ import annotations

import pytest

from app.errors import InvalidInput
from app.server.api.rest.codec import ENCODE_TENSORS, NORMALIZE_TENSORS, EncodeParams, NormalizeParams
from app.server.api.rest.fields import read


@pytest.mark.parametrize(
    ("body", "kind", "names", "target", "tensors"),
    [
        (b'{"data": [[1, 2]]}', NormalizeParams, NORMALIZE_TENSORS, ("layernorm", None), ["data"]),
        (
            b'{"model": "ln", "version": 2, "data": [1], "gamma": [1]}',
            NormalizeParams,
            NORMALIZE_TENSORS,
            ("ln", 2),
            ["data", "gamma"],
        ),
        (
            b'{"data": [[[0]]], "model": "encoder-preln"}',
            EncodeParams,
            ENCODE_TENSORS,
            ("encoder-preln", None),
            ["data"],
        ),
    ],
    ids=["defaults", "named-normalize", "named-encode"],
)
def test_a_body_names_its_model_and_its_tensors_before_they_are_parsed(
    body: bytes, kind: type, names: tuple[str, ...], target: tuple[str, object], tensors: list[str]
) -> None:
    parsed = read(body, kind, names)
    assert (parsed.params.model, parsed.params.version) == target
    assert sorted(parsed.tensors) == tensors


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b'{"data": [1], "epsilon": 1}',
            "epsilon: unknown field; expected only data, gamma, beta, model, version,"
            " normalized_shape, eps, eps_mode, backend, validate, dtype",
        ),
        (b'{"gamma": [1]}', "data: field required: a nested array of numbers"),
        (b"[1, 2]", "body: expected a JSON object with a `data` field"),
        (b'{"data": [1], "model": 3}', "model: Input should be a valid string (got 3)"),
    ],
    ids=["unknown-field", "no-data", "not-an-object", "wrong-type"],
)
def test_a_body_wrong_before_its_model_is_known_names_the_field(body: bytes, message: str) -> None:
    with pytest.raises(InvalidInput) as e:
        read(body, NormalizeParams, NORMALIZE_TENSORS)
    assert e.value.message == message
