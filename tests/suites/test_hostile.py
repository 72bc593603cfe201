"""Hostile bodies on every inference endpoint: each gets a 4xx with a JSON error, then a valid request is still right."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from app.core import reference
from app.core.runtime import Runtime
from tests.live_server import ROOT

ENDPOINTS = ["/normalize", "/encode", "/v2/models/layernorm/infer", "/v2/models/encoder/infer"]
D = 128  # d_model of the default export
HEADER_LENGTH = "Inference-Header-Content-Length"
LEAKS = ("Traceback", 'File "', "/work/", "/tmp/", "site-packages", "app/", ".py")


def is_v2(endpoint: str) -> bool:
    return endpoint.startswith("/v2")


def envelope(endpoint: str, data: bytes, extra: bytes = b"", shape: list[int] | None = None) -> bytes:
    """A request around a raw `data` text: REST `{"data": ...}` or a V2 `inputs` list; extra goes at top level."""
    if not is_v2(endpoint):
        return b'{"data": ' + data + extra + b"}"
    head = json.dumps({"name": "input", "shape": shape or [1, D], "datatype": "FP32"}).encode()[:-1]
    return b'{"inputs": [' + head + b', "data": ' + data + b"}]" + extra + b"}"


def is_layernorm(endpoint: str) -> bool:
    return endpoint in ("/normalize", "/v2/models/layernorm/infer")


def valid_data(endpoint: str) -> np.ndarray:
    """A small valid tensor: [2, 4] for layer norm, [2, 128] for /encode, [1, 2, 128] for the V2 encoder."""
    shape = (2, 4) if is_layernorm(endpoint) else (1, 2, D) if is_v2(endpoint) else (2, D)
    return np.random.default_rng(len(endpoint)).standard_normal(shape).astype(np.float32)


def valid_body(endpoint: str) -> bytes:
    x = valid_data(endpoint)
    return envelope(endpoint, json.dumps(x.tolist()).encode(), shape=list(x.shape))


@cache
def gzip_bomb() -> bytes:
    """Under 1 MiB on the wire, 80 MiB of JSON once inflated: past the 64 MiB limit."""
    return gzip.compress(b'{"data": [' + b"0," * (40 * 1024 * 1024), compresslevel=9)


Hostile = Callable[[str], bytes]


def with_number(text: bytes) -> Hostile:
    """A valid request whose first element is written as `text`."""

    def build(endpoint: str) -> bytes:
        x = valid_data(endpoint)
        data = json.dumps(x.tolist()).encode()
        first = data.lstrip(b"[").split(b",", 1)[0]
        return envelope(endpoint, data.replace(first, text, 1), shape=list(x.shape))

    return build


def tiny_rows_ragged(endpoint: str) -> bytes:
    rows = b"[0.5]," * 1_000_000 + b"[0.5, 0.5]"
    return envelope(endpoint, b"[" + rows + b"]", shape=[1_000_001, 1])


def duplicate_keys(endpoint: str) -> bytes:
    body = valid_body(endpoint)  # {"data": X} twice, or "inputs" twice: each copy valid on its own
    key = b'"inputs": ' if is_v2(endpoint) else b'"data": '
    value = body[len(b"{") + len(key) : -1]
    return b"{" + key + value + b", " + key + value + b"}"


LN, ENC, LN_V2, ENC_V2 = ENDPOINTS


def everywhere(message: str) -> dict[str, str]:
    """The same error on every endpoint."""
    return dict.fromkeys(ENDPOINTS, message)


def by_protocol(rest: str, v2: str, encoder_v2: str | None = None) -> dict[str, str]:
    """One error for both REST endpoints and one for both V2 endpoints (or a third for the V2 encoder)."""
    return {LN: rest, ENC: rest, LN_V2: v2, ENC_V2: v2 if encoder_v2 is None else encoder_v2}


# name, body builder, REST status, V2 status, the whole error per endpoint
HOSTILE: list[Any] = [
    pytest.param(
        lambda e: envelope(e, b"[" * 150_000 + b"]" * 150_000),
        400,
        400,
        by_protocol(
            "body: not valid JSON (depth limit exceeded: line 1 column 1034 (char 1033))",
            "body: not valid JSON (depth limit exceeded: line 1 column 1100 (char 1099))",
        ),
        id="nested-150000",
    ),
    pytest.param(
        lambda e: gzip_bomb(),
        413,
        413,
        everywhere("body: body exceeds 67108864 bytes (NORMSERVE_MAX_BODY_BYTES) after decompression"),
        id="gzip-bomb",
    ),
    pytest.param(
        lambda e: envelope(e, b"[1e999]"),
        400,
        400,
        by_protocol(
            "body: not valid JSON (number is infinity when parsed as double: line 1 column 11 (char 10))",
            "body: not valid JSON (number is infinity when parsed as double: line 1 column 79 (char 78))",
        ),
        id="number-1e999",
    ),
    pytest.param(
        with_number(b"1" + b"0" * 39),
        422,
        400,
        {
            LN: "data: element [0, 0] = 1e+39 is outside float32's finite range (|x| <= 3.402823e+38)",
            ENC: "data: element [0, 0] = 1e+39 is outside float32's finite range (|x| <= 3.402823e+38)",
            LN_V2: "inputs.input: element [0, 0] = 1e+39 is outside float32's finite range (|x| <= 3.402823e+38)",
            ENC_V2: "inputs.input: element [0, 0, 0] = 1e+39 is outside float32's finite range (|x| <= 3.402823e+38)",
        },
        id="number-40-digits",
    ),
    pytest.param(
        with_number(b"9" * 100_000),
        400,
        400,
        by_protocol(
            "body: not valid JSON (number is infinity when parsed as double: line 1 column 12 (char 11))",
            "body: not valid JSON (number is infinity when parsed as double: line 1 column 78 (char 77))",
            "body: not valid JSON (number is infinity when parsed as double: line 1 column 84 (char 83))",
        ),
        id="number-100000-digits",
    ),
    pytest.param(
        with_number(b"-1e999"),
        400,
        400,
        by_protocol(
            "body: not valid JSON (number is infinity when parsed as double: line 1 column 12 (char 11))",
            "body: not valid JSON (number is infinity when parsed as double: line 1 column 78 (char 77))",
            "body: not valid JSON (number is infinity when parsed as double: line 1 column 84 (char 83))",
        ),
        id="number-minus-1e999",
    ),
    pytest.param(
        tiny_rows_ragged,
        422,
        400,
        {
            LN: "data: row 1000000 has 2 elements, expected 1",
            ENC: "data: row 1000000 has 2 elements, expected 1",
            LN_V2: "inputs.input.data: row 1000000 has 2 elements, expected 1",
            ENC_V2: "inputs.input.data: row 1000000 has 2 elements, expected 1",
        },
        id="tiny-rows-1e6-ragged",
    ),
    pytest.param(
        lambda e: envelope(e, b'[1, "\xff\xfe"]'),
        400,
        400,
        everywhere("body: not valid JSON (str is not valid UTF-8: surrogates not allowed: line 1 column 1 (char 0))"),
        id="unicode-invalid-utf8",
    ),
    pytest.param(
        lambda e: envelope(e, b"[1]", b', "\\ud800": 1'),
        400,
        400,
        by_protocol(
            "body: not valid JSON (no low surrogate in string: line 1 column 16 (char 15))",
            "body: not valid JSON (no low surrogate in string: line 1 column 86 (char 85))",
        ),
        id="unicode-lone-surrogate",
    ),
    pytest.param(
        lambda e: envelope(e, "[\u0661]".encode()),
        400,
        400,
        by_protocol(
            "body: not valid JSON (unexpected character, expected a JSON value: line 1 column 11 (char 10))",
            "body: not valid JSON (unexpected character, expected a JSON value: line 1 column 79 (char 78))",
        ),
        id="unicode-arabic-digit",
    ),
    pytest.param(
        lambda e: envelope(e, b"[1]", b", " + '"\u202e\u200bdata": 1'.encode()),
        422,
        400,
        {
            LN: "\\u202e\\u200bdata: unknown field; expected only data, gamma, beta, model, version, normalized_shape, eps,"
            " eps_mode, backend, validate, dtype",
            ENC: "\\u202e\\u200bdata: unknown field; expected only data, padding_mask, model, version, validate, dtype",
            LN_V2: "\\u202e\\u200bdata: unknown field; expected only id, model_name, model_version, parameters, inputs, outputs",
            ENC_V2: "\\u202e\\u200bdata: unknown field; expected only id, model_name, model_version, parameters, inputs, outputs",
        },
        id="unicode-bidi-field",
    ),
    pytest.param(
        lambda e: envelope(e, b"[1]", b', "' + b"k" * 1_000_000 + b'": 1'),
        422,
        400,
        everywhere("k" * 999 + "…"),  # the echoed field name, cut at 1000 characters
        id="field-name-1mb",
    ),
    pytest.param(
        duplicate_keys,
        422,
        400,
        {
            LN: "data: given more than once in one object; send each field once",
            ENC: "data: given more than once in one object; send each field once",
            LN_V2: "inputs: given more than once in one object; send each field once",
            ENC_V2: "inputs: given more than once in one object; send each field once",
        },
        id="duplicate-keys",
    ),
    pytest.param(
        lambda e: valid_body(e)[:-1] + b', "colour": "red"}',
        422,
        400,
        {
            LN: "colour: unknown field; expected only data, gamma, beta, model, version, normalized_shape, eps,"
            " eps_mode, backend, validate, dtype",
            ENC: "colour: unknown field; expected only data, padding_mask, model, version, validate, dtype",
            LN_V2: "colour: unknown field; expected only id, model_name, model_version, parameters, inputs, outputs",
            ENC_V2: "colour: unknown field; expected only id, model_name, model_version, parameters, inputs, outputs",
        },
        id="extra-field",
    ),
    pytest.param(
        lambda e: b"\x00" * 1000,
        400,
        400,
        everywhere("body: not valid JSON (unexpected character, expected a JSON value: line 1 column 1 (char 0))"),
        id="nul-bytes",
    ),
]


@cache
def expected(endpoint: str, runtime: Runtime) -> np.ndarray:
    x = valid_data(endpoint)
    if is_layernorm(endpoint):
        return reference.layer_norm(x).output
    m = runtime.get("encoder")
    assert m.weights is not None and m.config is not None
    return reference.encoder(x.reshape(-1, *x.shape[-2:]), m.weights, m.config)[0].reshape(x.shape)


def assert_still_right(client: httpx.Client, endpoint: str, runtime: Runtime) -> None:
    r = client.post(endpoint, content=valid_body(endpoint), headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    doc = r.json()
    got = doc["outputs"][0]["data"] if is_v2(endpoint) else doc["output"]
    want = expected(endpoint, runtime)
    np.testing.assert_allclose(np.asarray(got).reshape(want.shape), want, atol=1e-4)


def assert_clean_error(r: httpx.Response, status: int, message: str) -> None:
    assert r.status_code == status, r.text[:300]
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error == message
    assert len(r.content) < 2000, "an error body must not echo the request back"
    assert not any(leak in error for leak in LEAKS), error


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize(("build", "rest_status", "v2_status", "errors"), HOSTILE)
def test_hostile_body_is_a_clean_4xx_and_the_server_still_answers_right(
    client: httpx.Client,
    runtime: Runtime,
    endpoint: str,
    build: Hostile,
    rest_status: int,
    v2_status: int,
    errors: dict[str, str],
) -> None:
    body = build(endpoint)
    headers = {"Content-Type": "application/json"}
    if body[:2] == b"\x1f\x8b":
        headers["Content-Encoding"] = "gzip"
    r = client.post(endpoint, content=body, headers=headers)
    assert_clean_error(r, v2_status if is_v2(endpoint) else rest_status, errors[endpoint])
    assert_still_right(client, endpoint, runtime)


V2_ENDPOINTS = [e for e in ENDPOINTS if is_v2(e)]


@pytest.mark.parametrize("endpoint", V2_ENDPOINTS)
@pytest.mark.parametrize(
    ("length", "errors"),
    [
        pytest.param(
            lambda n: str(n + 1_000_000),
            {
                LN_V2: "Inference-Header-Content-Length: 1000108 exceeds the body's 140 bytes (after decompression)",
                ENC_V2: "Inference-Header-Content-Length: 1000115 exceeds the body's 1139 bytes (after decompression)",
            },
            id="past-the-body",
        ),
        pytest.param(
            lambda n: "-5",
            dict.fromkeys(
                V2_ENDPOINTS, "Inference-Header-Content-Length: expected the JSON header's byte count, got '-5'"
            ),
            id="negative",
        ),
        pytest.param(
            lambda n: "12abc",
            dict.fromkeys(
                V2_ENDPOINTS, "Inference-Header-Content-Length: expected the JSON header's byte count, got '12abc'"
            ),
            id="not-a-number",
        ),
        pytest.param(
            lambda n: str(n // 2),
            {
                LN_V2: "body: not valid JSON (unexpected end of data: line 1 column 55 (char 54))",
                ENC_V2: "body: not valid JSON (unexpected end of data: line 1 column 58 (char 57))",
            },
            id="cuts-the-json",
        ),
        pytest.param(
            lambda n: "0",
            dict.fromkeys(
                V2_ENDPOINTS, "body: not valid JSON (Input is a zero-length, empty document: line 1 column 1 (char 0))"
            ),
            id="zero",
        ),
        pytest.param(
            lambda n: "9" * 400,
            {
                LN_V2: "Inference-Header-Content-Length: " + "9" * 400 + " exceeds the body's 140 bytes"
                " (after decompression)",
                ENC_V2: "Inference-Header-Content-Length: " + "9" * 400 + " exceeds the body's 1139 bytes"
                " (after decompression)",
            },
            id="400-digits",
        ),
    ],
)
def test_wrong_inference_header_length_is_400(
    client: httpx.Client, runtime: Runtime, endpoint: str, length: Callable[[int], str], errors: dict[str, str]
) -> None:
    x = valid_data(endpoint)
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
    head = json.dumps({"inputs": [tensor]}).encode()
    r = client.post(endpoint, content=head + x.tobytes(), headers={HEADER_LENGTH: length(len(head))})
    assert_clean_error(r, 400, errors[endpoint])
    assert_still_right(client, endpoint, runtime)


def raw_exchange(base: str, request: bytes, half_close: bool = False) -> bytes:
    """Send bytes as they are (no client library would frame them this wrongly) and read until the server closes."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize(
    ("headers", "body", "half_close", "status_line"),
    [
        pytest.param(b"Content-Length: abc\r\n", b"{}", False, b"HTTP/1.1 400", id="length-not-a-number"),
        pytest.param(b"Content-Length: -1\r\n", b"", False, b"HTTP/1.1 400", id="length-negative"),
        pytest.param(b"Content-Length: 5\r\n", b'{"data": [1, 2]}', False, b"HTTP/1.1 400", id="length-short"),
        pytest.param(
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            b"0\r\n\r\n",
            False,
            b"HTTP/1.1 400",
            id="length-and-chunked",
        ),
        pytest.param(b"Content-Length: 100000\r\n", b'{"data": [1]}', True, b"", id="length-long-then-close"),
    ],
)
def test_wrong_content_length_gets_400_or_a_closed_connection(
    server: str,
    client: httpx.Client,
    runtime: Runtime,
    endpoint: str,
    headers: bytes,
    body: bytes,
    half_close: bool,
    status_line: bytes,
) -> None:
    request = b"POST " + endpoint.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n" + body
    answer = raw_exchange(server, request, half_close)
    assert answer.startswith(status_line), answer[:200]
    assert not any(leak.encode() in answer for leak in LEAKS), answer[:500]
    assert_still_right(client, endpoint, runtime)


# ---- security: no pickle, eval or shell on the request path; no traceback or path in a 500 ----

APP = ROOT / "app"
FORBIDDEN = {
    "pickle": re.compile(r"\bimport pickle\b|\bpickle\.|allow_pickle\s*=\s*True|\bmarshal\b"),
    "eval/exec": re.compile(r"(?<![\w.])(eval|exec|compile|__import__)\("),
    "shell": re.compile(r"\bsubprocess\b|\bos\.(system|popen|exec\w*|spawn\w*)\b|shell\s*=\s*True"),
}


@pytest.mark.parametrize("what", FORBIDDEN)
def test_request_path_has_no_pickle_eval_or_shell(what: str) -> None:
    # app/export/ is the offline exporter (torch, run by hand or at image build); everything else serves requests.
    sources = [p for p in APP.rglob("*.py") if "export" not in p.relative_to(APP).parts]
    assert len(sources) > 10
    hits = [
        f"{p.relative_to(APP)}:{n}"
        for p in sources
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if FORBIDDEN[what].search(line)
    ]
    assert hits == []


def test_an_unexpected_error_is_a_500_without_traceback_or_path(tmp_path: Path) -> None:
    from app.main import create_app
    from app.settings import Settings

    app = create_app(Settings(model_dir=tmp_path))

    def boom() -> None:  # stands for any bug on a request path: the message names a file, as tracebacks do
        raise RuntimeError(f"failed at {APP / 'runtime.py'}")

    app.add_api_route("/boom", boom)

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # the real app, in process
        async with httpx.AsyncClient(transport=transport, base_url="http://normserve") as c:
            return await c.get("/boom")

    r = asyncio.run(call())
    assert r.status_code == 500
    assert r.json() == {"error": "internal error"}
    assert not any(leak.encode() in r.content for leak in LEAKS)
