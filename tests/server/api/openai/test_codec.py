"""codec.py: OpenAI's bodies parsed field by field (strict types, every message whole) and the answers encoded:
base64 is the little-endian float32 bytes of the float answer; token ids named by their position as sent, on a
tiny BERT in process. What needs a server (texts, kinds, widths) is driven live in test_routes.py."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
import pytest

from app.core.dataplane import ModelInfo
from app.core.textencoder import TextEncoderModel, TextInput, TextOutput
from app.errors import InvalidInput, PayloadTooLarge
from app.server.api.openai import codec
from app.server.dataplane import INLINE_BODY_BYTES
from app.settings import Settings

INFO = ModelInfo("bert", "1", "0" * 64)


def _refused(fn: Any, *args: Any) -> str:
    with pytest.raises(InvalidInput) as e:
        fn(*args)
    return e.value.message


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        (
            {"model": "bert", "input": "a"},
            {"encoding_format": "float", "dimensions": None, "user": None, "truncate": True},
        ),
        (
            {
                "model": "bert",
                "input": ["a"],
                "encoding_format": "base64",
                "dimensions": 32,
                "user": "u",
                "truncate": False,
            },
            {"encoding_format": "base64", "dimensions": 32, "user": "u", "truncate": False},
        ),
    ],
    ids=["defaults", "every field"],
)
def test_embeddings_fields_are_read_with_their_defaults(body: dict[str, Any], fields: dict[str, Any]) -> None:
    params = codec.parse(codec.EmbeddingsParams, orjson.dumps(body))
    assert (params.model, params.input, params.return_layer_norms) == (body["model"], body["input"], False)
    assert {name: getattr(params, name) for name in fields} == fields


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[1]", "body: [1]; expected a JSON object"),
        (b'"x"', "body: 'x'; expected a JSON object"),
        (b'{"model": "m"}', "input: field required"),
        (b'{"model": 3, "input": "a"}', "model: Input should be a valid string (got 3)"),
        (b'{"model": "m", "input": "a", "truncate": "yes"}', "truncate: Input should be a valid boolean (got 'yes')"),
        (b'{"model": "m", "input": "a", "dimensions": 1.5}', "dimensions: Input should be a valid integer (got 1.5)"),
        # strict: JSON's true is no integer, as 1.5 is none
        (b'{"model": "m", "input": "a", "dimensions": true}', "dimensions: Input should be a valid integer (got True)"),
        (b'{"model": "m", "input": "a", "user": 5}', "user: Input should be a valid string (got 5)"),
    ],
)
def test_embeddings_bodies_are_refused_naming_the_field(body: bytes, message: str) -> None:
    assert _refused(codec.parse, codec.EmbeddingsParams, body) == message


def test_tokenize_takes_only_model_and_input() -> None:
    body = b'{"model": "m", "input": "a", "truncate": true}'
    assert _refused(codec.parse, codec.TokenizeParams, body) == "truncate: unknown field; expected only model, input"


@pytest.mark.parametrize(("value", "texts"), [("one", ["one"]), (["a", "b"], ["a", "b"])])
def test_tokenize_input_is_a_string_or_a_list_of_them(value: Any, texts: list[str]) -> None:
    assert codec.texts_of(value) == texts


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "input: None; expected a string or a non-empty list of strings"),
        ({"a": 1}, "input: {'a': 1}; expected a string or a non-empty list of strings"),
        (
            ["a"] * (codec.MAX_INPUTS + 1),
            f"input: {codec.MAX_INPUTS + 1} inputs; at most {codec.MAX_INPUTS} per request",
        ),
    ],
)
def test_tokenize_input_is_refused_naming_it(value: Any, message: str) -> None:
    assert _refused(codec.texts_of, value) == message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([2, 5, 300], "input[2]: token id 300 is outside the vocabulary; expected 0 <= id < 300"),
        ([[2], [2, 5, 300]], "input[1][2]: token id 300 is outside the vocabulary; expected 0 <= id < 300"),
        ([-1, 5], "input[0]: token id -1 is outside the vocabulary; expected 0 <= id < 300"),
        ([[-1, 5]], "input[0][0]: token id -1 is outside the vocabulary; expected 0 <= id < 300"),
        ([2, "5"], "input: [2, '5']; expected integers"),
        ([[2], [2, 1.5]], "input[1]: [2, 1.5]; expected integers"),
        ([2] * 25, "input: 25 token ids; the model takes at most 24"),
        ([[2], [2] * 25], "input[1]: 25 token ids; the model takes at most 24"),
        ([[2], []], "input[1]: []; expected a non-empty list of token ids"),
    ],
    ids=[
        "flat, past the vocabulary",
        "lists, past the vocabulary",
        "flat, negative",
        "lists, negative",
        "flat, not ints",
        "lists, not ints",
        "flat, too many",
        "lists, too many",
        "lists, an empty one",
    ],
)
def test_a_bad_token_id_is_named_by_its_position_as_the_sender_wrote_it(
    tiny_bert: TextEncoderModel, value: Any, message: str
) -> None:
    """A flat list is one text's ids (input[j]); a list of lists, one list per text (input[i][j])."""
    assert tiny_bert.config.vocab_size == 300  # the messages' bound
    assert _refused(codec.tokens_of, tiny_bert, value, True) == message


@pytest.mark.parametrize("value", [[2, 5, 3], [[2, 5, 3]]], ids=["flat", "lists"])
def test_token_ids_flat_or_in_a_list_are_one_text(tiny_bert: TextEncoderModel, value: Any) -> None:
    tokens = codec.tokens_of(tiny_bert, value, True)
    np.testing.assert_array_equal(tokens.input_ids, [[2, 5, 3]])
    np.testing.assert_array_equal(tokens.attention_mask, [[1, 1, 1]])


@pytest.mark.parametrize(("tokens", "limit"), [([3, 4], 7), ([5, 5], 10)])
def test_a_request_within_the_token_limit_passes(tokens: list[int], limit: int) -> None:
    mask = np.array([[1] * n + [0] * (max(tokens) - n) for n in tokens], dtype=np.int64)
    codec.check_total(TextInput(mask, mask), Settings(max_request_tokens=limit))


def test_a_request_over_the_token_limit_is_a_413_naming_the_setting() -> None:
    mask = np.ones((2, 5), dtype=np.int64)
    with pytest.raises(PayloadTooLarge) as e:
        codec.check_total(TextInput(mask, mask), Settings(max_request_tokens=9))
    assert e.value.message == "input: 10 tokens; at most 9 per request (NORMSERVE_MAX_REQUEST_TOKENS)"


def _output(rows: np.ndarray, tokens: list[int]) -> TextOutput:
    seq = max(tokens)
    mean = np.arange(len(rows) * seq, dtype=np.float32).reshape(len(rows), seq)
    return TextOutput(rows, [("ln", mean, mean + 0.5)], INFO, tokens)


EMBEDDINGS = np.array([[0.1, -2.5, 3e-8, 1.0], [np.float32(1 / 3), 0.0, -0.0, 7.25]], dtype=np.float32)


@pytest.mark.parametrize("dimensions", [4, 2])
def test_base64_is_the_little_endian_float32_bytes_of_the_floats(dimensions: int) -> None:
    answers = {
        fmt: orjson.loads(
            codec.encode_embeddings(codec.Wire("bert", fmt, dimensions, False), _output(EMBEDDINGS, [2, 3]))
        )
        for fmt in ("float", "base64")
    }
    floats = np.array([d["embedding"] for d in answers["float"]["data"]], dtype=np.float32)
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in answers["base64"]["data"]]
    np.testing.assert_array_equal(floats, EMBEDDINGS[:, :dimensions])
    np.testing.assert_array_equal(np.stack(decoded), EMBEDDINGS[:, :dimensions])


def test_the_answer_is_openais_list_with_the_tokens_as_usage() -> None:
    answer = orjson.loads(codec.encode_embeddings(codec.Wire("bert", "float", 4, False), _output(EMBEDDINGS, [2, 3])))
    assert [(d["object"], d["index"]) for d in answer["data"]] == [("embedding", 0), ("embedding", 1)]
    assert (answer["object"], answer["model"]) == ("list", "bert")
    assert answer["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert all("layer_norms" not in d for d in answer["data"])


def test_layer_norms_cover_each_texts_own_tokens_only() -> None:
    answer = orjson.loads(codec.encode_embeddings(codec.Wire("bert", "float", 4, True), _output(EMBEDDINGS, [2, 3])))
    assert [d["layer_norms"] for d in answer["data"]] == [
        [{"name": "ln", "mean": [0.0, 1.0], "std": [0.5, 1.5]}],
        [{"name": "ln", "mean": [3.0, 4.0, 5.0], "std": [3.5, 4.5, 5.5]}],
    ]


@pytest.mark.parametrize(
    ("status", "field", "kind", "code"),
    [
        (400, "input", "invalid_request_error", None),
        (401, None, "authentication_error", None),
        (403, None, "permission_error", None),
        (404, "model", "not_found_error", "model_not_found"),
        (404, None, "not_found_error", None),
        (413, "input", "invalid_request_error", "request_too_large"),
        (500, None, "server_error", None),
        (503, None, "server_error", "overloaded"),
        (504, None, "server_error", "timeout"),
    ],
)
def test_errors_take_openais_type_and_code_by_status(
    status: int, field: str | None, kind: str, code: str | None
) -> None:
    assert codec.error_body("why", field, status) == {
        "error": {"message": "why", "type": kind, "param": field, "code": code}
    }


@pytest.mark.parametrize("body", [b"", b"{}", b"x" * (2 * INLINE_BODY_BYTES)])
def test_an_embeddings_request_always_runs_off_the_event_loop(body: bytes) -> None:
    assert codec.EmbeddingsCodec(Settings()).size(body) > INLINE_BODY_BYTES
