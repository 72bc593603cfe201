"""Every error row of spec section 5 for /normalize and /encode: the status and a message naming the field."""

from __future__ import annotations

import gzip
from typing import Any

import httpx
import pytest

from app.server.api.rest.fields import KEEP_BODY_BYTES

D = 128  # d_model of the default export
ROW = [0.1] * D


def _large_row(value: float, fields: str) -> bytes:
    """An /encode body of one position of +-value, d_model wide, with more fields."""
    return f'{{"data": [{[value, -value] * (D // 2)}], {fields}}}'.encode()


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        pytest.param(
            "/normalize",
            b"{not json",
            400,
            "body: not valid JSON (unexpected character, expected a string key: line 1 column 2 (char 1))",
            id="not-json",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [NaN, 1]}',
            400,
            "body: not valid JSON (unexpected character, expected a JSON value: line 1 column 11 (char 10))",
            id="nan-token",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [Infinity]}',
            400,
            "body: not valid JSON (unexpected character, expected a JSON value: line 1 column 11 (char 10))",
            id="infinity-token",
        ),
        pytest.param(
            "/encode",
            b"[" * 150_000 + b"]" * 150_000,
            400,
            "body: not valid JSON (depth limit exceeded: line 1 column 1026 (char 1025))",
            id="nested-150000",
        ),
        pytest.param("/normalize", b"[1, 2]", 422, "body: expected a JSON object with a `data` field", id="not-object"),
        pytest.param("/normalize", b"{}", 422, "data: field required: a nested array of numbers", id="no-data"),
        pytest.param(
            "/normalize", b'{"data": [[1, 2, 3], [4, 5]]}', 422, "data: row 1 has 2 elements, expected 3", id="ragged"
        ),
        pytest.param(
            "/normalize",
            b'{"data": 5}',
            422,
            "data: expected a nested array of numbers of rank >= 1, got a scalar",
            id="rank0",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [[]]}',
            422,
            "data: dimension 1 is empty (shape [1, 0]); every dimension needs >= 1",
            id="empty-dim",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [1, "x"]}',
            422,
            "data: element [1] is a string, expected a number",
            id="non-numeric",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [1, true]}',
            422,
            "data: booleans are not numbers; expected an array of numbers",
            id="boolean",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [1e39, 1]}',
            422,
            "data: element [0] = 1e+39 is outside float32's finite range (|x| <= 3.402823e+38)",
            id="float32-range",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [[1, 2]], "normalized_shape": [3]}',
            422,
            "normalized_shape: [3] is not the trailing dims of data's shape [1, 2]; expected e.g. [2] or [1, 2]",
            id="ns-not-trailing",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [[1, 2]], "normalized_shape": [1, 1, 2]}',
            422,
            "normalized_shape: [1, 1, 2] is not the trailing dims of data's shape [1, 2]; expected e.g. [2] or [1, 2]",
            id="ns-too-long",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [[1, 2]], "normalized_shape": "2"}',
            422,
            "normalized_shape: expected an int or a list of ints",
            id="ns-type",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [1, 2], "eps": 0}',
            422,
            "eps: expected a finite number > 0, got 0.0",
            id="eps-zero",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [1, 2], "eps": -1}',
            422,
            "eps: expected a finite number > 0, got -1.0",
            id="eps-negative",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [1, 2], "eps_mode": "rms"}',
            422,
            "eps_mode: expected 'var' or 'std', got 'rms'",
            id="eps-mode",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [1, 2], "backend": "torch"}',
            422,
            "backend: Input should be 'onnxruntime' or 'numpy' (got 'torch')",
            id="backend",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [1, 2], "validate": "yes"}',
            422,
            "validate: Input should be a valid boolean (got 'yes')",
            id="validate-type",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [1, 2], "colour": 1}',
            422,
            "colour: unknown field; expected only data, gamma, beta, model, version, normalized_shape, eps, eps_mode, "
            "backend, validate, dtype",
            id="extra-field",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [[1, 2]], "gamma": [1, 2, 3]}',
            422,
            "gamma: shape [3] does not match the normalized dims of data, [2]",
            id="gamma-shape",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [[1, 2]], "beta": [[1, 2]]}',
            422,
            "beta: shape [1, 2] does not match the normalized dims of data, [2]",
            id="beta-shape",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [0, 0, 0, 1], "gamma": [3e38, 3e38, 3e38, 3e38]}',
            422,
            "output: the result is not finite in FP32 (it overflows); scale the input or gamma down, or use a larger eps",
            id="result-overflow",
        ),
        pytest.param(
            "/normalize",
            b'{"data": ' + b"[" * 40 + b"1" + b"]" * 40 + b"}",
            422,
            "data: nesting deeper than 32 (NORMSERVE_MAX_DEPTH)",
            id="too-deep",
        ),
        pytest.param(
            "/encode",
            b'{"data": [[1, 2]]}',
            422,
            "data: last dimension is 2, expected d_model = 128",
            id="wrong-d-model",
        ),
        pytest.param(
            "/encode",
            b'{"data": [1, 2]}',
            422,
            "data: rank 1 (shape [2]); expected [batch, seq, 128] or [seq, 128]",
            id="encode-rank",
        ),
        pytest.param(
            "/encode",
            _large_row(1e38, '"model": "encoder"'),
            422,
            "layers.0.norm1.mean: the result is not finite in FP32 (it overflows); scale the input down",
            id="post-ln-overflow",
        ),
        *(
            pytest.param(  # pre-LN normalizes the input first: its float32 variance overflows, its output stays finite
                "/encode",
                _large_row(1e20, '"model": "encoder-preln"' + extra),
                422,
                "layers.0.norm1.std: the result is not finite in FP32 (it overflows); scale the input down",
                id="pre-ln-variance-overflow" + name,
            )
            for extra, name in [("", ""), (', "dtype": "bfloat16"', "-bfloat16")]
        ),
        pytest.param(
            "/encode",
            b'{"data": [[1]], "model": "gpt"}',
            404,
            "model: unknown model 'gpt'; available: encoder, encoder-preln, layernorm",
            id="unknown-model",
        ),
        pytest.param(
            "/encode",
            b'{"data": [[1]], "model": "layernorm"}',
            422,
            "model: 'layernorm' is of kind layernorm; /encode takes an encoder model",
            id="not-encoder",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [[1, 2]], "model": "encoder"}',
            422,
            "model: 'encoder' is of kind encoder; /normalize takes a layernorm model",
            id="not-layernorm",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [[1, 2]], "model": "gpt"}',
            404,
            "model: unknown model 'gpt'; available: encoder, encoder-preln, layernorm",
            id="normalize-unknown-model",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [[1, 2]], "version": "2"}',
            404,
            "version: model 'layernorm' has no ready version '2'; ready: 1",
            id="unknown-version",
        ),
        pytest.param(
            "/encode",
            b'{"data": [[1]], "version": 3}',
            404,
            "version: model 'encoder' has no ready version 3; ready: 1",
            id="encode-unknown-version",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [[1, 2]], "version": "1e9"}',
            422,
            "version: expected a positive integer version (1..2147483647), got '1e9'",
            id="version-not-an-integer",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [[1, 2]], "version": 0}',
            422,
            "version: expected a positive integer version (1..2147483647), got 0",
            id="version-zero",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [[1, 2]], "model": "Bad Name"}',
            422,
            "model: expected a model name matching [A-Za-z0-9][A-Za-z0-9_.-]{0,63}, got 'Bad Name'",
            id="model-name",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [[1, 2]], "dtype": "half"}',
            422,
            "dtype: Input should be 'float32', 'float16' or 'bfloat16' (got 'half')",
            id="dtype-unknown",
        ),
        pytest.param(
            "/normalize",
            b'{"data": [[1, 2]], "beta": [0, -70000], "dtype": "float16"}',
            422,
            "beta: element [1] = -70000 is outside float16's finite range (|x| <= 65504)",
            id="dtype-beta-beyond-range",
        ),
        pytest.param(
            "/encode",
            b'{"data": [[1e39]], "dtype": "bfloat16"}',
            422,
            "data: element [0, 0] = 1e+39 is outside bfloat16's finite range (|x| <= 3.389531e+38)",
            id="dtype-data-beyond-range",
        ),
    ],
)
def test_error_row(client: httpx.Client, path: str, body: bytes, status: int, message: str) -> None:
    r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"] == message


def _encode(client: httpx.Client, **fields: Any) -> httpx.Response:
    return client.post("/encode", json=fields)


def test_sequence_longer_than_max_is_422(client: httpx.Client) -> None:
    r = _encode(client, data=[ROW] * 513)
    assert r.status_code == 422
    assert r.json()["error"] == (
        "data: sequence length 513 exceeds max_sequence_length 512"
        " (set at export: normserve export --max-sequence-length)"
    )


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        pytest.param(
            [[True]], "padding_mask: shape [1, 1] does not match data's [batch, seq] = [1, 2]", id="mask-shape"
        ),
        pytest.param([[1, 0]], "padding_mask: expected an array of booleans (true/false)", id="mask-not-bool"),
        pytest.param([[None, False]], "padding_mask: element [0, 0] is null, expected a boolean", id="mask-null"),
        pytest.param([[True], [False, True]], "padding_mask: row 1 has 2 elements, expected 1", id="mask-ragged"),
    ],
)
def test_bad_padding_mask_is_422(client: httpx.Client, mask: Any, message: str) -> None:
    r = _encode(client, data=[[ROW, ROW]], padding_mask=mask)
    assert r.status_code == 422 and r.json()["error"] == message


@pytest.mark.parametrize("path", ["/normalize", "/encode"])
def test_wrong_content_type_is_415(client: httpx.Client, path: str) -> None:
    r = client.post(path, content=b"data=1", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415
    assert r.json()["error"] == (
        "content-type: Content-Type 'application/x-www-form-urlencoded' is not supported; send application/json"
    )


@pytest.mark.parametrize("path", ["/normalize", "/encode"])
def test_body_over_limit_is_413_from_content_length(client: httpx.Client, path: str) -> None:
    big = b'{"data": [' + b"0," * (32 * 1024 * 1024) + b"0]}"
    r = client.post(path, content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"] == "body: body exceeds 67108864 bytes (NORMSERVE_MAX_BODY_BYTES)"


def test_gzip_bomb_is_413_after_decompression(client: httpx.Client) -> None:
    bomb = gzip.compress(b'{"data": [' + b"0," * (40 * 1024 * 1024), compresslevel=9)
    assert len(bomb) < 1024 * 1024
    r = client.post(
        "/normalize", content=bomb, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
    )
    assert r.status_code == 413
    assert r.json()["error"] == "body: body exceeds 67108864 bytes (NORMSERVE_MAX_BODY_BYTES) after decompression"


def test_corrupt_gzip_is_400(client: httpx.Client) -> None:
    r = client.post("/normalize", content=b"\x1f\x8bnot gzip", headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400
    assert r.json()["error"] == (
        "body: invalid compressed data (Error -3 while decompressing data: unknown compression method)"
    )


def test_server_keeps_answering_after_hostile_bodies(client: httpx.Client) -> None:
    for body in (b"[" * 150_000, b"\xff\xfe", b'{"data": [' + b"1," * 100_000 + b"]}"):
        assert 400 <= client.post("/normalize", content=body).status_code < 500
    assert client.post("/normalize", json={"data": [0.2, 0.1, 0.3]}).status_code == 200


@pytest.mark.parametrize(
    ("dtype", "printed"),
    [
        ("float16", b'"output":[[-1.342,-0.4473,0.4473,1.342]]'),
        ("bfloat16", b'"output":[[-1.34,-0.447,0.447,1.34]]'),  # 1.34375 and 0.447265625
    ],
)
def test_normalize_prints_each_output_as_the_shortest_decimal_of_its_dtype(
    client: httpx.Client, dtype: str, printed: bytes
) -> None:
    # +-1.3416 and +-0.4472 are far from halfway between two values of either type: no kernel's digit decides them.
    r = client.post("/normalize", json={"data": [[1, 2, 3, 4]], "dtype": dtype})
    assert r.status_code == 200, r.text
    assert printed in r.content


@pytest.mark.parametrize("elements", [64, 20_000], ids=["small-body", "body-past-keep-bytes"])
@pytest.mark.parametrize(
    ("fields", "key"),
    [(b'"eps": 1e-5, "eps": 1e-3', "eps"), (b'"extra": {"a": 1, "a": 2}', "a")],
    ids=["top-level", "nested-object"],
)
def test_a_repeated_key_is_named_whatever_the_bodys_size(
    client: httpx.Client, elements: int, fields: bytes, key: str
) -> None:
    body = b'{"data": [' + b", ".join([b"0.5", b"1.5"] * (elements // 2)) + b"], " + fields + b"}"
    assert (len(body) <= KEEP_BODY_BYTES) == (elements == 64)
    r = client.post("/normalize", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["error"] == f"{key}: given more than once in one object; send each field once"


@pytest.mark.parametrize("elements", [64, 20_000], ids=["small-body", "body-past-keep-bytes"])
@pytest.mark.parametrize("token", [b"true", b"false"])
def test_a_boolean_among_the_numbers_is_refused_whatever_the_bodys_size(
    client: httpx.Client, elements: int, token: bytes
) -> None:
    body = b'{"data": [' + b", ".join([b"0.5", b"1.5"] * (elements // 2) + [token]) + b"]}"
    assert (len(body) <= KEEP_BODY_BYTES) == (elements == 64)
    r = client.post("/normalize", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "data: booleans are not numbers; expected an array of numbers"
