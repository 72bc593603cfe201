"""The V2 infer route over raw HTTP: every error row of spec section 5, the binary layout, and parity with REST."""

from __future__ import annotations

import gzip
import socket
import struct
import time
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import orjson
import pytest

from app.core import reference
from app.core.halfprecision import HALF_DTYPES, narrow, ulp_errors, widen
from app.core.runtime import Runtime
from app.core.seeds import SEED003
from tests.live_server import live_server
from tests.repositories import broken_copy, not_ready_reason

LN = "/v2/models/layernorm/infer"
ENC = "/v2/models/encoder/infer"
D = 128  # d_model of the default export
HEADER = "Inference-Header-Content-Length"
SEED003_X = np.asarray(SEED003.x).tolist()  # seed 003's input, as JSON lists


def _json(*inputs: dict[str, Any], **fields: Any) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **fields})


def _fp32(data: Any, shape: list[int] | None = None, name: str = "input", datatype: str = "FP32") -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": list(np.shape(data)) if shape is None else shape, "data": data}


def _binary(inputs: list[tuple[str, str, list[int], bytes]], **fields: Any) -> tuple[bytes, dict[str, str]]:
    """A binary-tensor request as tritonclient builds it: JSON header, then each input's bytes."""
    head = orjson.dumps(
        {
            "inputs": [
                {"name": n, "datatype": dt, "shape": s, "parameters": {"binary_data_size": len(b)}}
                for n, dt, s, b in inputs
            ],
            **fields,
        }
    )
    return head + b"".join(b for *_, b in inputs), {HEADER: str(len(head))}


def _assert_error(r: httpx.Response, status: int, message: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert '{"detail"' not in r.text
    assert r.json() == {"error": message}, r.text


ROW_F32 = np.array([1, 2, 3], np.float32).tobytes()

ERRORS = [
    pytest.param(
        LN,
        b"{not json",
        {},
        400,
        "body: not valid JSON (unexpected character, expected a string key: line 1 column 2 (char 1))",
        id="not-json",
    ),
    pytest.param(
        LN,
        b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1], "data": [NaN]}]}',
        {},
        400,
        "body: not valid JSON (unexpected character, expected a JSON value: line 1 column 74 (char 73))",
        id="nan-token",
    ),
    pytest.param(
        LN,
        b"[" * 150_000 + b"]" * 150_000,
        {},
        400,
        "body: not valid JSON (depth limit exceeded: line 1 column 1026 (char 1025))",
        id="nested-150000",
    ),
    pytest.param(LN, b"[1]", {}, 400, "body: expected a JSON object with `inputs`", id="not-object"),
    pytest.param(LN, b"{}", {}, 400, "inputs: expected a non-empty list of input tensors", id="no-inputs"),
    pytest.param(
        LN,
        _json(_fp32([1.0]), colour=1),
        {},
        400,
        "colour: unknown field; expected only id, model_name, model_version, parameters, inputs, outputs",
        id="unknown-field",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0]), model_name="encoder"),
        {},
        400,
        "model_name: 'encoder' is not the model of the URL, 'layernorm'",
        id="body-model-name",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0]), model_version="2"),
        {},
        400,
        "model_version: '2' is not the version that serves this request, 1",
        id="body-model-version",
    ),
    pytest.param(
        "/v2/models/layernorm/versions/1/infer",
        _json(_fp32([1.0]), model_version=2),
        {},
        400,
        "model_version: 2 is not the version that serves this request, 1",
        id="body-model-version-int",
    ),
    pytest.param(LN, _json(_fp32([1.0]), id=5), {}, 400, "id: expected a string, got 5", id="id-not-string"),
    pytest.param(
        LN,
        _json(_fp32([[1, 2, 3], [4, 5]], [2, 3])),
        {},
        400,
        "inputs.input.data: row 1 has 2 elements, expected 3",
        id="ragged",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0], [])),
        {},
        400,
        "inputs.input.shape: rank 0; expected 1..32 (NORMSERVE_MAX_DEPTH)",
        id="rank0-shape",
    ),
    pytest.param(
        LN,
        _json(_fp32(5, [1])),
        {},
        400,
        "inputs.input.data: expected a nested array of numbers of rank >= 1, got a scalar",
        id="rank0-data",
    ),
    pytest.param(
        LN,
        _json(_fp32([[]], [1, 0])),
        {},
        400,
        "inputs.input: dimension 1 is empty (shape [1, 0]); every dimension needs >= 1",
        id="empty-dim",
    ),
    pytest.param(
        LN,
        _json(_fp32([1, "x"], [2])),
        {},
        400,
        "inputs.input.data: element [1] is a string, expected a number",
        id="non-numeric",
    ),
    pytest.param(
        LN,
        _json(_fp32([1, True], [2])),
        {},
        400,
        "inputs.input.data: booleans are not numbers; expected an array of numbers",
        id="boolean",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0] * 6, [2, 2])),
        {},
        400,
        "inputs.input.data: 6 elements, but shape [2, 2] needs 4",
        id="wrong-count",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0], ["1"])),
        {},
        400,
        "inputs.input.shape: expected a list of integers, got ['1']",
        id="shape-type",
    ),
    pytest.param(
        ENC,
        _json(_fp32([[[1.0, 2.0]]])),
        {},
        400,
        "inputs.input: last dimension is 2, expected d_model = 128 (model 'encoder', version 1)",
        id="encoder-shape",
    ),
    pytest.param(
        LN,
        _json(_fp32([1e39, 1.0])),
        {},
        400,
        "inputs.input: element [0] = 1e+39 is outside float32's finite range (|x| <= 3.402823e+38)",
        id="float32-range",
    ),
    pytest.param(
        LN,
        _json(_fp32([1e39, 1.0], datatype="FP64")),
        {},
        400,
        "inputs.input: element [0] = 1e+39 is outside float32's finite range (|x| <= 3.402823e+38)",
        id="fp64-range",
    ),
    pytest.param(
        LN,
        _json(_fp32([1, 2], datatype="INT32")),
        {},
        400,
        "inputs.input: datatype 'INT32' is not supported; expected FP32, FP64, FP16 or BF16",
        id="datatype",
    ),
    pytest.param(
        ENC,
        _json(_fp32([[[0.0] * D]]), _fp32([[1.0]], name="padding_mask")),
        {},
        400,
        "inputs.padding_mask: datatype 'FP32' is not supported; expected BOOL",
        id="mask-datatype",
    ),
    pytest.param(
        ENC,
        _json(_fp32([[[0.0] * D]]), _fp32([[1]], name="padding_mask", datatype="BOOL")),
        {},
        400,
        "inputs.padding_mask.data: expected an array of booleans (true/false)",
        id="mask-not-bool",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0], name="colour")),
        {},
        400,
        "inputs.colour: unknown input for model 'layernorm'; expected input, gamma, beta",
        id="unknown-input",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0], name="gamma")),
        {},
        400,
        "inputs.input: required input missing for model 'layernorm'",
        id="missing-input",
    ),
    pytest.param(LN, _json(_fp32([1.0]), _fp32([1.0])), {}, 400, "inputs.input: given twice", id="duplicate-input"),
    pytest.param(
        LN,
        _json(_fp32([[1.0, 2.0]]), _fp32([1.0, 2.0, 3.0], name="gamma")),
        {},
        400,
        "inputs.gamma: shape [3] does not match the normalized dims of inputs.input, [2]",
        id="gamma-shape",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0, 2.0]), parameters={"eps_mode": "rms"}),
        {},
        400,
        "parameters.eps_mode: expected 'var' or 'std', got 'rms'",
        id="eps-mode",
    ),
    *(
        pytest.param(
            LN,
            _json(_fp32([1.0, 2.0]), parameters={"colour": 1, name: 1e-3}),
            {},
            400,
            f"parameters.{name}: unknown parameter for model 'layernorm'; did you mean '{known}'? "
            "(it reads eps, eps_mode, normalized_ndim; other names are ignored)",
            id=f"misspelt-param-{name}",
        )
        for name, known in [
            ("epsilon", "eps"),
            ("Eps", "eps"),
            ("mode", "eps_mode"),
            ("normalized-ndim", "normalized_ndim"),
        ]
    ),
    pytest.param(
        LN,
        _json({**_fp32([1.0, 2.0]), "parameters": {"content_type": 1}}),
        {},
        400,
        "inputs.input.parameters.content_type: expected a string, got 1",
        id="content-type-not-string",
    ),
    pytest.param(
        LN,
        _json({**_fp32([1.0, 2.0]), "parameters": {"shm": "r0"}}),
        {},
        400,
        "inputs.input: parameters {'shm': 'r0'} are not supported; only binary_data_size or content_type is",
        id="tensor-param",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0, 2.0]), parameters={"eps": 0}),
        {},
        400,
        "parameters.eps: expected a finite number > 0, got 0",
        id="eps-zero",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0, 2.0]), parameters={"eps": -1e-5}),
        {},
        400,
        "parameters.eps: expected a finite number > 0, got -1e-05",
        id="eps-negative",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0, 2.0]), parameters={"eps": "1e-5x"}),
        {},
        400,
        "parameters.eps: expected a finite number > 0, got '1e-5x'",
        id="eps-string-not-a-number",
    ),
    pytest.param(
        LN,
        _json(_fp32([[1.0, 2.0]]), parameters={"normalized_ndim": 0}),
        {},
        400,
        "parameters.normalized_ndim: expected an integer in 1..2 (the input's rank), got 0",
        id="k-zero",
    ),
    pytest.param(
        LN,
        _json(_fp32([[1.0, 2.0]]), parameters={"normalized_ndim": 3}),
        {},
        400,
        "parameters.normalized_ndim: expected an integer in 1..2 (the input's rank), got 3",
        id="k-over-rank",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0, 2.0]), parameters={"binary_data_output": 1}),
        {},
        400,
        "parameters.binary_data_output: expected true or false, got 1",
        id="binary-output-type",
    ),
    pytest.param(
        LN,
        _json(_fp32([0.0, 0.0, 0.0, 1.0]), _fp32([3e38] * 4, name="gamma")),
        {},
        400,
        "output: the result is not finite in FP32 (it overflows); scale the input or gamma down, or use a larger eps",
        id="result-overflow",
    ),
    pytest.param(  # only `output` asked for: pre-LN's first LayerNorm overflowed, so its finite output is wrong too
        "/v2/models/encoder-preln/infer",
        _json(_fp32([[[1e20, -1e20] * 64]]), outputs=[{"name": "output"}]),
        {},
        400,
        "layers.0.norm1.std: the result is not finite in FP32 (it overflows); scale the input down",
        id="pre-ln-variance-overflow",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0, 1.0]), parameters={"eps": 1e-45, "eps_mode": "std"}),
        {},
        400,
        "outputs.inv_std_dev: the result is not finite in FP32 (it overflows); scale the input or gamma down, or use a larger eps",
        id="inv-std-overflow",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0]), outputs=[{"name": "var"}]),
        {},
        400,
        "outputs[0]: unknown output 'var'; expected one of output, mean, inv_std_dev",
        id="unknown-output",
    ),
    pytest.param(
        LN,
        _json(_fp32([1.0]), outputs=[{"name": "mean", "parameters": {"classification": 2}}]),
        {},
        400,
        "outputs.mean: parameters {'classification': 2} are not supported; only binary_data and datatype are",
        id="classification",
    ),
    pytest.param(
        "/v2/models/gpt/infer",
        _json(_fp32([1.0])),
        {},
        404,
        "model: unknown model 'gpt'; available: encoder, encoder-preln, layernorm",
        id="unknown-model",
    ),
    pytest.param(
        "/v2/models/layernorm/versions/2/infer",
        _json(_fp32([1.0])),
        {},
        404,
        "version: model 'layernorm' has no ready version '2'; ready: 1",
        id="unknown-version",
    ),
    pytest.param(
        "/v2/models/layernorm/versions/1e9/infer",
        _json(_fp32([1.0])),
        {},
        400,
        "version: expected a positive integer version (1..2147483647), got '1e9'",
        id="version-not-an-integer",
    ),
    pytest.param(
        "/v2/models/bad%20name/infer",
        _json(_fp32([1.0])),
        {},
        400,
        "model: expected a model name matching [A-Za-z0-9][A-Za-z0-9_.-]{0,63}, got 'bad name'",
        id="model-name",
    ),
    # The binary tensor layout.
    pytest.param(
        LN,
        *_binary([("input", "FP32", [3], np.array([1, np.nan, 3], np.float32).tobytes())]),
        400,
        "inputs.input: element [1] = nan is outside float32's finite range (|x| <= 3.402823e+38)",
        id="binary-nan",
    ),
    pytest.param(
        LN,
        *_binary([("input", "FP64", [2], np.array([1, np.inf]).tobytes())]),
        400,
        "inputs.input: element [1] = inf is outside float32's finite range (|x| <= 3.402823e+38)",
        id="binary-fp64-inf",
    ),
    pytest.param(
        LN,
        *_binary([("input", "FP64", [2], np.array([1, 1e39]).tobytes())]),
        400,
        "inputs.input: element [1] = 1e+39 is outside float32's finite range (|x| <= 3.402823e+38)",
        id="binary-fp64-range",
    ),
    pytest.param(
        LN,
        *_binary([("input", "FP32", [2], ROW_F32)]),
        400,
        "inputs.input.parameters.binary_data_size: binary_data_size is 12 bytes, but shape [2] of FP32 needs 8",
        id="binary-size-vs-shape",
    ),
    pytest.param(
        LN,
        _binary([("input", "FP32", [3], ROW_F32)])[0],
        {HEADER: "twelve"},
        400,
        "Inference-Header-Content-Length: expected the JSON header's byte count, got 'twelve'",
        id="header-not-number",
    ),
    pytest.param(
        LN,
        _binary([("input", "FP32", [3], ROW_F32)])[0],
        {HEADER: _binary([("input", "FP32", [3], ROW_F32)])[1][HEADER].encode() + b"\xa0"},
        400,
        f"Inference-Header-Content-Length: expected the JSON header's byte count, got "
        f"'{_binary([('input', 'FP32', [3], ROW_F32)])[1][HEADER]}\\xa0'",
        id="header-count-then-no-break-space",
    ),
    pytest.param(
        LN,
        _binary([("input", "FP32", [3], ROW_F32)])[0],
        {HEADER: "100000"},
        400,
        "Inference-Header-Content-Length: 100000 exceeds the body's 108 bytes (after decompression)",
        id="header-longer-than-body",
    ),
    pytest.param(
        LN,
        _binary([("input", "FP32", [3], ROW_F32)])[0] + b"\0",
        _binary([("input", "FP32", [3], ROW_F32)])[1],
        400,
        "binary_data_size: the inputs' binary_data_size add up to 12 bytes, but 13 follow the JSON header",
        id="bytes-left-over",
    ),
    pytest.param(
        LN,
        _binary([("input", "FP32", [3], ROW_F32)])[0][:-1],
        _binary([("input", "FP32", [3], ROW_F32)])[1],
        400,
        "inputs.input.parameters.binary_data_size: 12 bytes declared, but only 11 follow (is Inference-Header-Content-Length set?)",
        id="bytes-missing",
    ),
    pytest.param(
        LN,
        _binary([("input", "FP32", [3], ROW_F32)])[0][:-12],
        {},
        400,
        "inputs.input.parameters.binary_data_size: 12 bytes declared, but only 0 follow (is Inference-Header-Content-Length set?)",
        id="size-without-header",
    ),
]


@pytest.mark.parametrize(("path", "body", "headers", "status", "message"), ERRORS)
def test_error_row(
    client: httpx.Client, path: str, body: bytes, headers: dict[str, str], status: int, message: str
) -> None:
    _assert_error(client.post(path, content=body, headers=headers), status, message)


def test_deep_nesting_is_400_and_the_server_keeps_serving(client: httpx.Client) -> None:
    _assert_error(
        client.post(LN, content=b"[" * 150_000 + b"]" * 150_000),
        400,
        "body: not valid JSON (depth limit exceeded: line 1 column 1026 (char 1025))",
    )
    assert client.post(LN, content=_json(_fp32(SEED003_X))).status_code == 200


def test_gzip_bomb_is_413_after_decompression(client: httpx.Client) -> None:
    bomb = gzip.compress(_json(_fp32([0.0]))[:-3] + b"0," * (40 * 1024 * 1024), compresslevel=9)
    assert len(bomb) < 1024 * 1024
    _assert_error(
        client.post(LN, content=bomb, headers={"Content-Encoding": "gzip"}),
        413,
        "body: body exceeds 67108864 bytes (NORMSERVE_MAX_BODY_BYTES) after decompression",
    )


def test_content_length_over_limit_is_413_before_the_body_is_read(server: str) -> None:
    # A raw socket: the server must answer from the header alone, without 64 MiB ever being sent.
    url = urlsplit(server)
    with socket.create_connection((url.hostname, url.port), timeout=10) as s:
        s.sendall(f"POST {LN} HTTP/1.1\r\nHost: x\r\nContent-Length: {64 * 1024 * 1024 + 1}\r\n\r\n{{".encode())
        reply = b""
        while b'"}' not in reply and (chunk := s.recv(65536)):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert orjson.loads(body) == {"error": "body: body exceeds 67108864 bytes (NORMSERVE_MAX_BODY_BYTES)"}


@pytest.mark.parametrize(
    ("path", "inputs", "params", "answered"),
    [
        (LN, [_fp32([1.0, 2.0])], {"eps": 1e-3, "priority": 1}, None),
        (LN, [_fp32([1.0, 2.0])], {"colour": 1}, {"ignored_parameters": "colour"}),
        (LN, [_fp32([1.0, 2.0])], {"trace": "t", "alpha": [1], "eps": 1e-3}, {"ignored_parameters": "alpha,trace"}),
        (ENC, [_fp32([[[0.0] * D]])], {"eps": 1, "eps_mode": "std"}, {"ignored_parameters": "eps,eps_mode"}),
        (LN, [{**_fp32([1.0, 2.0]), "parameters": {"content_type": "np"}}], {}, None),
    ],
    ids=["known", "unknown", "two-unknown", "encoder-reads-none", "tensor-content-type"],
)
def test_unknown_parameters_are_ignored_and_answered_back(
    client: httpx.Client, path: str, inputs: list[dict[str, Any]], params: dict[str, Any], answered: Any
) -> None:
    r = client.post(path, content=_json(*inputs, parameters=params, id="p-1"))
    plain = client.post(path, content=_json(*inputs, id="p-1"))
    assert r.status_code == 200, r.text
    assert r.json().get("parameters") == answered
    ignored = set(answered["ignored_parameters"].split(",")) if answered else set()
    if set(params) <= ignored:  # nothing read: the same answer as without them
        assert {k: v for k, v in r.json().items() if k != "parameters"} == plain.json()


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/octet-stream"])
def test_any_content_type_is_read(client: httpx.Client, content_type: str | None) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    r = client.post(LN, content=_json(_fp32(SEED003_X), id="req-7"), headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "req-7" and r.headers["content-type"] == "application/json"


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_binary_response_to_a_compressed_request_goes_out_uncompressed(client: httpx.Client, encoding: str) -> None:
    body, headers = _binary([("input", "FP32", [3], ROW_F32)], id="bin-1", parameters={"binary_data_output": True})
    compress = gzip.compress if encoding == "gzip" else zlib.compress
    r = client.post(
        LN, content=compress(body), headers={**headers, "Content-Encoding": encoding, "Accept-Encoding": encoding}
    )
    assert r.status_code == 200, r.text
    assert "content-encoding" not in r.headers and r.headers["content-type"] == "application/octet-stream"
    n = int(r.headers[HEADER])
    head = orjson.loads(r.content[:n])
    assert head["id"] == "bin-1" and [o["parameters"]["binary_data_size"] for o in head["outputs"]] == [12, 4, 4]
    assert len(r.content) == n + 20
    out = np.frombuffer(r.content[n : n + 12], np.float32)
    np.testing.assert_allclose(out, [-1.2247, 0, 1.2247], atol=1e-4)
    assert struct.unpack("<f", r.content[n + 12 : n + 16])[0] == pytest.approx(2.0)


def test_identity_accept_encoding_is_not_compressed(client: httpx.Client) -> None:
    r = client.post(LN, content=_json(_fp32([1.0, 2.0])), headers={"Accept-Encoding": "gzip;q=0, identity"})
    assert r.status_code == 200 and "content-encoding" not in r.headers and HEADER not in r.headers


def test_nested_and_flat_json_data_give_the_same_result(client: httpx.Client) -> None:
    flat = client.post(LN, content=_json(_fp32(np.ravel(SEED003_X).tolist(), [2, 3]))).json()
    nested = client.post(LN, content=_json(_fp32(SEED003_X))).json()
    assert flat == nested and flat["outputs"][0]["shape"] == [2, 3] and len(flat["outputs"][0]["data"]) == 6


def _outputs(r: httpx.Response) -> dict[str, np.ndarray]:
    assert r.status_code == 200, r.text
    return {o["name"]: np.reshape(o["data"], o["shape"]) for o in r.json()["outputs"]}


@pytest.mark.parametrize(
    ("k", "eps_mode", "affine"),
    [(1, "var", False), (2, "std", True), (3, "var", True)],
    ids=["k1-var", "k2-std-affine", "k3-var-affine"],
)
def test_layernorm_equals_post_normalize(client: httpx.Client, k: int, eps_mode: str, affine: bool) -> None:
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((2, 3, 4)) * 5 + 1e3).astype(np.float32)
    inputs = [_fp32(x.tolist())]
    rest: dict[str, Any] = {
        "data": x.tolist(),
        "normalized_shape": list(x.shape[-k:]),
        "eps": 1e-4,
        "eps_mode": eps_mode,
    }
    if affine:
        gamma, beta = rng.uniform(0.5, 2, x.shape[-k:]), rng.standard_normal(x.shape[-k:])
        inputs += [_fp32(gamma.tolist(), name="gamma"), _fp32(beta.tolist(), name="beta")]
        rest |= {"gamma": gamma.tolist(), "beta": beta.tolist()}
    v2 = _outputs(
        client.post(LN, content=_json(*inputs, parameters={"eps": 1e-4, "eps_mode": eps_mode, "normalized_ndim": k}))
    )
    body = client.post("/normalize", json=rest).json()
    np.testing.assert_allclose(v2["output"], body["output"], atol=1e-6)
    np.testing.assert_allclose(v2["mean"], body["stats"]["mean"], rtol=1e-6)
    std = np.asarray(body["stats"]["std"])
    np.testing.assert_allclose(
        v2["inv_std_dev"], 1 / (np.sqrt(std**2 + 1e-4) if eps_mode == "var" else std + 1e-4), rtol=1e-6
    )


@pytest.mark.parametrize("model", ["encoder", "encoder-preln"])
def test_encoder_equals_post_encode(client: httpx.Client, runtime: Runtime, model: str) -> None:
    x = np.random.default_rng(3).standard_normal((2, 4, D)).astype(np.float32)
    mask = [[False] * 4, [False, False, True, True]]
    v2 = _outputs(
        client.post(
            f"/v2/models/{model}/infer",
            content=_json(
                _fp32(x.tolist()), {"name": "padding_mask", "datatype": "BOOL", "shape": [2, 4], "data": mask}
            ),
        )
    )
    body = client.post("/encode", json={"data": x.tolist(), "padding_mask": mask, "model": model}).json()
    np.testing.assert_allclose(v2["output"], body["output"], atol=1e-6)
    assert [n for n in v2 if n != "output"] == [
        f"{n}.{s}" for n in runtime.get(model).layer_norms for s in ("mean", "std")
    ]
    for ln in body["layer_norms"]:
        np.testing.assert_allclose(v2[ln["name"] + ".mean"], ln["mean"], atol=1e-6)
        np.testing.assert_allclose(v2[ln["name"] + ".std"], ln["std"], atol=1e-6)


def test_a_binary_mask_reads_any_nonzero_byte_as_true(client: httpx.Client) -> None:
    """perf_analyzer's random data sends any byte for BOOL: C and NumPy read nonzero as true, and so does the codec."""
    x = np.random.default_rng(4).standard_normal((1, 4, D)).astype(np.float32)
    body, headers = _binary(
        [("input", "FP32", [1, 4, D], x.tobytes()), ("padding_mask", "BOOL", [1, 4], b"\0\0\7\xff")]
    )
    binary = _outputs(client.post(ENC, content=body, headers=headers))
    mask = {"name": "padding_mask", "datatype": "BOOL", "shape": [1, 4], "data": [False, False, True, True]}
    as_json = _outputs(client.post(ENC, content=_json(_fp32(x.tolist()), mask)))
    for name, values in as_json.items():
        np.testing.assert_allclose(binary[name], values, atol=1e-6)


@pytest.mark.parametrize(
    ("path", "status", "body"),
    [
        ("/v2", 200, None),
        ("/v2/models/layernorm/ready", 200, {"name": "layernorm", "ready": True}),
        ("/v2/models/encoder/versions/1/ready", 200, {"name": "encoder", "ready": True}),
        ("/v2/models/encoder/versions/1", 200, None),
        ("/v2/models/layernorm/versions/1/stats", 200, None),
        ("/v2/models/gpt", 404, {"error": "model: unknown model 'gpt'; available: encoder, encoder-preln, layernorm"}),
        (
            "/v2/models/gpt/ready",
            404,
            {"error": "model: unknown model 'gpt'; available: encoder, encoder-preln, layernorm"},
        ),
        (
            "/v2/models/layernorm/versions/2",
            404,
            {"error": "version: model 'layernorm' has no ready version '2'; ready: 1"},
        ),
        (
            "/v2/models/layernorm/versions/2/ready",
            404,
            {"error": "version: model 'layernorm' has no ready version '2'; ready: 1"},
        ),
        (
            "/v2/models/gpt/stats",
            404,
            {"error": "model: unknown model 'gpt'; available: encoder, encoder-preln, layernorm"},
        ),
        ("/v2/", 200, None),
        ("/v2/models/layernorm/config", 200, None),
        ("/v2/models/layernorm/versions/1/config", 200, None),
        (
            "/v2/models/gpt/config",
            404,
            {"error": "model: unknown model 'gpt'; available: encoder, encoder-preln, layernorm"},
        ),
        (
            "/v2/models/layernorm/versions/2/config",
            404,
            {"error": "version: model 'layernorm' has no ready version '2'; ready: 1"},
        ),
        (
            "/v2/models/layernorm/versions/1e9",
            400,
            {"error": "version: expected a positive integer version (1..2147483647), got '1e9'"},
        ),
        (
            "/v2/models/layernorm/versions/0/ready",
            400,
            {"error": "version: expected a positive integer version (1..2147483647), got '0'"},
        ),
        (
            "/v2/models/bad%20name/stats",
            400,
            {"error": "model: expected a model name matching [A-Za-z0-9][A-Za-z0-9_.-]{0,63}, got 'bad name'"},
        ),
    ],
)
def test_metadata_routes(client: httpx.Client, path: str, status: int, body: dict[str, Any] | None) -> None:
    r = client.get(path)
    assert r.status_code == status, r.text
    if status >= 400:
        assert body is not None
        _assert_error(r, status, body["error"])
    elif body is not None:
        assert r.json() == body


def test_not_ready_server_answers_503_for_the_model_that_failed_and_serves_the_others(tmp_path: Path) -> None:
    # layernorm's sha256 mismatch: it never serves, the server is not ready (strict), the encoders serve
    models = broken_copy(tmp_path, "tampered")
    reason = not_ready_reason(models, "tampered")
    with live_server({"NORMSERVE_MODEL_DIR": str(models)}, wait_ready=False) as base, httpx.Client(base_url=base) as c:
        for _ in range(100):
            if "model check failed" in c.get("/v2/health/ready").text:
                break
            time.sleep(0.05)
        ready = c.get("/v2/models/encoder/ready")
        assert ready.headers["retry-after"] == "1"
        assert (ready.status_code, ready.json()) == (
            503,
            {"name": "encoder", "ready": False, "error": f"not ready: {reason}"},
        )
        _assert_error(c.get("/v2/models/layernorm"), 503, f"server is not ready: {reason}")
        _assert_error(c.get("/v2/models/layernorm/versions/1/config"), 503, f"server is not ready: {reason}")
        assert c.get("/v2/models/encoder/versions/1/config").status_code == 200
        assert c.post(ENC, content=_json(_fp32([[[0.0] * D]]))).status_code == 200


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_binary_in_is_two_bytes_per_element_out(client: httpx.Client, datatype: str) -> None:
    """The statistics in FP32, four bytes each, as onnxruntime's LayerNormalization types them."""
    x = narrow(np.asarray(SEED003.x), datatype, "x")
    body, headers = _binary([("input", datatype, [2, 3], x.tobytes())], parameters={"binary_data_output": True})
    r = client.post(LN, content=body, headers=headers)
    assert r.status_code == 200, r.text
    n = int(r.headers[HEADER])
    head = orjson.loads(r.content[:n])
    assert [(o["name"], o["datatype"], o["parameters"]["binary_data_size"]) for o in head["outputs"]] == [
        ("output", datatype, 12),
        ("mean", "FP32", 8),
        ("inv_std_dev", "FP32", 8),
    ]
    output = np.frombuffer(r.content[n : n + 12], HALF_DTYPES[datatype]).reshape(2, 3)
    truth = reference.layer_norm(widen(x), 1, 1e-5, "var").output
    assert float(ulp_errors(output, truth, datatype).max()) <= 1.0


@pytest.mark.parametrize(("datatype", "dtype"), [("FP16", "float16"), ("BF16", "bfloat16")])
def test_half_precision_json_equals_post_normalize_with_dtype(client: httpx.Client, datatype: str, dtype: str) -> None:
    """JSON numbers rounded to the type on both routes, the same values out: V2 prints them exactly (as float64
    does), /normalize as the shortest decimals of the type."""
    r = client.post(LN, content=_json(_fp32(SEED003_X, datatype=datatype)))
    assert r.status_code == 200, r.text
    v2 = {o["name"]: o for o in r.json()["outputs"]}
    assert v2["output"]["datatype"] == datatype
    rest = client.post("/normalize", json={"data": SEED003_X, "dtype": dtype}).json()
    exact = np.array(v2["output"]["data"], np.float64)
    np.testing.assert_array_equal(widen(narrow(exact, datatype, "output")), exact)  # printed exactly
    shortest = narrow(np.array(rest["output"], np.float64), datatype, "output").ravel()
    np.testing.assert_array_equal(widen(shortest), exact)
