"""app/server/http/body.py and the limits behind it: every limit (spec 5, issue 5) answers 413/422 (400 on V2) naming
the limit and its NORMSERVE_ setting. Backpressure and the timeout are the Worker's (tests/server/test_worker.py)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.live_server import live_server

LN_V2 = "/v2/models/layernorm/infer"
ENC_V2 = "/v2/models/encoder/infer"
HEADER_LENGTH = "Inference-Header-Content-Length"
SMALL = {"NORMSERVE_MAX_BODY_BYTES": "65536", "NORMSERVE_MAX_ELEMENTS": "1000", "NORMSERVE_MAX_DEPTH": "4"}


@pytest.fixture(scope="module")
def small() -> Iterator[httpx.Client]:
    """A server with small limits, so that going past each one is cheap."""
    with live_server(SMALL) as base, httpx.Client(base_url=base, timeout=30) as c:
        yield c


def nested(depth: int) -> object:
    value: object = 1.0
    for _ in range(depth):
        value = [value]
    return value


def v2(data: object, shape: list[int], **tensor: object) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "input", "shape": shape, "datatype": "FP32", "data": data, **tensor}]}
    ).encode()


def binary_v2(shape: list[int]) -> tuple[bytes, dict[str, str]]:
    x = np.zeros(shape, dtype=np.float32)
    tensor = {"name": "input", "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
    head = json.dumps({"inputs": [tensor]}).encode()
    return head + x.tobytes(), {HEADER_LENGTH: str(len(head))}


BIG_BODY = b'{"data": [' + b"0," * 40_000 + b"0]}"  # 80 KB > 64 KiB
LIMITS = [
    # body size: from Content-Length, from a chunked stream, after decompression
    pytest.param(
        "/normalize", BIG_BODY, {}, 413, "body: body exceeds 65536 bytes (NORMSERVE_MAX_BODY_BYTES)", id="body-rest"
    ),
    pytest.param(LN_V2, BIG_BODY, {}, 413, "body: body exceeds 65536 bytes (NORMSERVE_MAX_BODY_BYTES)", id="body-v2"),
    pytest.param(
        "/encode",
        gzip.compress(BIG_BODY),
        {"Content-Encoding": "gzip"},
        413,
        "body: body exceeds 65536 bytes (NORMSERVE_MAX_BODY_BYTES) after decompression",
        id="body-gzip-rest",
    ),
    pytest.param(
        ENC_V2,
        gzip.compress(BIG_BODY),
        {"Content-Encoding": "gzip"},
        413,
        "body: body exceeds 65536 bytes (NORMSERVE_MAX_BODY_BYTES) after decompression",
        id="body-gzip-v2",
    ),
    # element count
    pytest.param(
        "/normalize",
        json.dumps({"data": [0.5] * 1001}).encode(),
        {},
        422,
        "data: 1001 elements exceed the limit of 1000 (NORMSERVE_MAX_ELEMENTS)",
        id="elements-rest",
    ),
    pytest.param(
        "/normalize",
        json.dumps({"data": [[0.5] * 40] * 26}).encode(),
        {},
        422,
        "data: 1040 elements exceed the limit of 1000 (NORMSERVE_MAX_ELEMENTS)",
        id="elements-rest-2d",
    ),
    pytest.param(
        LN_V2,
        v2([0.5] * 1001, [1001]),
        {},
        400,
        "inputs.input: 1001 elements exceed the limit of 1000 (NORMSERVE_MAX_ELEMENTS)",
        id="elements-v2-json",
    ),
    pytest.param(
        LN_V2,
        *binary_v2([1001]),
        400,
        "inputs.input: 1001 elements exceed the limit of 1000 (NORMSERVE_MAX_ELEMENTS)",
        id="elements-v2-binary",
    ),
    pytest.param(
        LN_V2,
        v2([0.5], [10**6, 10**6]),
        {},
        400,
        "inputs.input: 1000000000000 elements exceed the limit of 1000 (NORMSERVE_MAX_ELEMENTS)",
        id="elements-v2-shape-only",
    ),
    # rank and nesting depth
    pytest.param(
        "/normalize",
        json.dumps({"data": nested(5)}).encode(),
        {},
        422,
        "data: nesting deeper than 4 (NORMSERVE_MAX_DEPTH)",
        id="depth-rest",
    ),
    pytest.param(
        LN_V2,
        v2(nested(5), [1, 1, 1, 1, 1]),
        {},
        400,
        "inputs.input.shape: rank 5; expected 1..4 (NORMSERVE_MAX_DEPTH)",
        id="rank-v2",
    ),
    pytest.param(
        LN_V2,
        v2(nested(5), [1]),
        {},
        400,
        "inputs.input.data: nesting deeper than 4 (NORMSERVE_MAX_DEPTH)",
        id="depth-v2-json-data",
    ),
]


@pytest.mark.parametrize(("path", "body", "headers", "status", "message"), LIMITS)
def test_over_a_limit_names_the_limit_and_its_setting(
    small: httpx.Client, path: str, body: bytes, headers: dict[str, str], status: int, message: str
) -> None:
    r = small.post(path, content=body, headers=headers)
    assert r.status_code == status, r.text
    assert r.json()["error"] == message


def test_chunked_body_over_the_limit_is_413_while_streaming(small: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit must hold on the stream itself
        yield b'{"data": ['
        for _ in range(100):
            yield b"0," * 500
        yield b"0]}"

    r = small.post("/normalize", content=chunks())
    assert r.status_code == 413
    assert r.json()["error"] == "body: body exceeds 65536 bytes (NORMSERVE_MAX_BODY_BYTES)"


@pytest.mark.parametrize("path", ["/encode", ENC_V2])
def test_sequence_over_the_export_limit_names_the_export_option(client: httpx.Client, path: str) -> None:
    # A property of the exported model (its positional encoding table), set by `normserve export`;
    # 513 x 128 elements, under the default element limit, so the sequence check is the one hit.
    if path == ENC_V2:
        r = client.post(path, content=(parts := binary_v2([1, 513, 128]))[0], headers=parts[1])
    else:
        r = client.post(path, json={"data": [[0.0] * 128] * 513})
    assert r.status_code == (400 if path == ENC_V2 else 422)
    field = "inputs.input" if path == ENC_V2 else "data"
    assert r.json()["error"] == (
        f"{field}: sequence length 513 exceeds max_sequence_length 512 (set at export: normserve export --max-sequence-length)"
    )
