"""Every limit (spec 5, issue 5) answers 413/422 (400 on V2) naming the limit and its NORMSERVE_ setting; backpressure and timeout."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from app.core.seeds import SEED003
from app.server.api.errors import printable
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


def test_error_messages_are_bounded_and_printable() -> None:
    assert printable("\u202edata: unknown field") == "\\u202edata: unknown field"
    assert len(printable("k" * 10_000)) == 1000


# ---- backpressure and timeout: a server that admits one inference at a time, for at most 0.5 s ----

SLOW = {"NORMSERVE_MAX_IN_FLIGHT": "1", "NORMSERVE_REQUEST_TIMEOUT_S": "0.5", "NORMSERVE_INTRA_OP_THREADS": "1"}


@pytest.fixture(scope="module")
def one_at_a_time() -> Iterator[str]:
    with live_server(SLOW) as base:
        yield base


def slow_request() -> tuple[bytes, dict[str, str]]:
    """Seconds of encoder work on one thread: [32, 512, 128] floats in binary."""
    return binary_v2([32, 512, 128])


async def wait_admitting(client: httpx.AsyncClient, timeout: float = 60) -> None:
    """Until the abandoned inference of an earlier test has really ended and a request is admitted again."""
    deadline = time.monotonic() + timeout
    while (await client.post("/normalize", json={"data": [1, 2]})).status_code != 200:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)


async def overloaded(base: str) -> tuple[httpx.Response, httpx.Response, float, float]:
    body, headers = slow_request()
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        await wait_admitting(client)
        slow = asyncio.ensure_future(client.post(ENC_V2, content=body, headers=headers))
        await asyncio.sleep(0.2)  # the slow one is admitted and running
        t0 = time.monotonic()
        refused = await client.post("/normalize", json={"data": [1, 2]})
        refused_after = time.monotonic() - t0
        first = await slow
        return refused, first, refused_after, time.monotonic() - t0


def test_past_max_in_flight_is_503_with_retry_after_at_once(one_at_a_time: str) -> None:
    refused, first, refused_after, first_after = asyncio.run(overloaded(one_at_a_time))
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"] == "1 requests in flight, the limit (NORMSERVE_MAX_IN_FLIGHT)"
    assert refused_after < first_after, "the refused request waited for the running one: it was queued"


def test_past_the_request_timeout_is_504_and_the_worker_serves_on(one_at_a_time: str) -> None:
    body, headers = slow_request()

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=one_at_a_time, timeout=60) as client:
            await wait_admitting(client)
            timed_out = await client.post(ENC_V2, content=body, headers=headers)
            await wait_admitting(client)
            return timed_out, await client.post("/normalize", json={"data": SEED003.x[0]})

    timed_out, after = asyncio.run(scenario())
    assert timed_out.status_code == 504
    assert timed_out.json()["error"] == "inference took longer than 0.5 s (NORMSERVE_REQUEST_TIMEOUT_S)"
    assert after.status_code == 200
    np.testing.assert_allclose(after.json()["output"], SEED003.output[0], atol=1e-4)
