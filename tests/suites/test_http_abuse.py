"""HTTP-level abuse over raw sockets, on both of uvicorn's HTTP parsers (httptools, which `normserve serve` uses,
and h11): each gets the status documented in docs/api.md section 5, no worker is lost, and the next request is
answered right.

The statuses here are partly uvicorn's own: a request its parser refuses never reaches normserve and gets
uvicorn's plain-text 400 `Invalid HTTP request received.`; the two parsers disagree on one of these
(docs/reliability.md lists both); a head over 64 KiB gets normserve's 431 on both (app/server/http/heads.py). The server has a 64 KiB body limit and a 0.5 s body deadline, so that going
past each is cheap.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from app.core.runtime import Runtime
from tests.live_server import server_process
from tests.suites.test_hostile import assert_still_right

LIMITS = {"NORMSERVE_MAX_BODY_BYTES": "65536", "NORMSERVE_BODY_TIMEOUT_S": "0.5"}
PARSERS = ("httptools", "h11")
UVICORN_400 = (400, "Invalid HTTP request received.")
TOO_LARGE = (413, '{"error":"body: body exceeds 65536 bytes (NORMSERVE_MAX_BODY_BYTES)"}')
HEAD_TOO_LARGE = (431, '{"error":"headers: the request head exceeds 65536 bytes"}')
TOO_SLOW = (408, '{"error":"body: did not arrive in full within 0.5 s (NORMSERVE_BODY_TIMEOUT_S)"}')
SEED = b'{"data": [[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]]}'


@dataclass
class Server:
    base: str
    proc: Any
    parser: str
    client: httpx.Client

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.base.removeprefix("http://").split(":")
        return host, int(port)


@pytest.fixture(scope="module", params=PARSERS)
def abused(request: pytest.FixtureRequest) -> Iterator[Server]:
    with (
        server_process(LIMITS, args=["--http", request.param]) as (base, proc),
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        yield Server(base, proc, request.param, client)


def both(*answers: tuple[int, bytes | str]) -> dict[str, list[tuple[int, bytes | str]]]:
    """The same answers from either parser."""
    return {parser: list(answers) for parser in PARSERS}


@dataclass
class Exchange:
    answers: list[tuple[int, bytes]]  # (status, body) of each response, in order
    closed: bool  # the server closed the connection (rather than keeping it alive)


def parse(raw: bytes) -> list[tuple[int, bytes]]:
    """Responses one after another: with a Content-Length, chunked, or (uvicorn's h11 400) until the close."""
    answers = []
    while raw:
        head, _, raw = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = {k.lower(): v for k, v in (line.split(b": ", 1) for line in lines[1:])}
        status = int(lines[0].split()[1])
        if b"content-length" in headers or status == 100:
            length = int(headers.get(b"content-length", b"0"))
            body, raw = raw[:length], raw[length:]
        elif headers.get(b"transfer-encoding") == b"chunked":
            body, raw = dechunk(raw)
        else:
            body, raw = raw, b""
        answers.append((status, body))
    return answers


def dechunk(raw: bytes) -> tuple[bytes, bytes]:
    body = b""
    while True:
        size, _, raw = raw.partition(b"\r\n")
        n = int(size, 16)
        body, raw = body + raw[:n], raw[n + 2 :]
        if n == 0:
            return body, raw


def exchange(server: Server, parts: list[tuple[bytes, float]], wait: float = 5.0) -> Exchange:
    """Send each part then sleep its pause; read until the server closes, or `wait` seconds of silence."""
    with socket.create_connection(server.address, timeout=wait) as s:
        try:
            for data, pause in parts:
                s.sendall(data)
                time.sleep(pause)
        except OSError:  # the server closed while we were still sending: what it answered is in the buffer
            pass
        raw, closed = b"", False
        try:
            while chunk := s.recv(1 << 16):
                raw += chunk
            closed = True
        except TimeoutError:
            pass
        except ConnectionResetError:  # closed with our unread bytes in its buffer: a reset, after the answer
            closed = True
    return Exchange(parse(raw), closed)


def request(method: str, path: bytes, headers: bytes = b"", body: bytes = b"") -> bytes:
    return method.encode() + b" " + path + b" HTTP/1.1\r\nHost: normserve\r\n" + headers + b"\r\n" + body


def chunked(body: bytes, size: int = 4096) -> bytes:
    chunks = (body[i : i + size] for i in range(0, len(body), size))
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


BIG = b'{"data": [' + b"0.5, " * 20_000 + b"0.5]}"  # 100 KB: over the 64 KiB limit
CLOSE = b"Connection: close\r\n"
LENGTH = b"Content-Length: %d\r\n"
URL = b"/v2/models/" + b"a" * 65536
EMPTY_BODY = (
    400,
    '{"error":"body: not valid JSON (Input is a zero-length, empty document: line 1 column 1 (char 0))"}',
)


def v2_seed() -> bytes:
    return json.dumps({"inputs": [{"name": "input", "shape": [2, 3], "datatype": "FP32", "data": [0.2] * 6}]}).encode()


# parts to send, {parser: [(status, body), ...]} (b"": the body is not compared); the server closes each connection
CASES: list[Any] = [
    pytest.param(
        [
            (
                request(
                    "POST", b"/normalize", CLOSE + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"
                ),
                0,
            )
        ],
        # request smuggling's classic: httptools refuses it; h11 lets Transfer-Encoding win (RFC 9112 6.3), and
        # an empty chunked body is not JSON
        {"httptools": [UVICORN_400], "h11": [EMPTY_BODY]},
        id="content-length-and-chunked",
    ),
    pytest.param(
        [(request("POST", b"/normalize", b"Expect: 100-continue\r\nContent-Length: 10000000000\r\n"), 0)],
        both(TOO_LARGE),  # from Content-Length, before any `100 Continue`: the body is never sent
        id="expect-100-continue-10GB",
    ),
    pytest.param(
        [(request("POST", b"/normalize", CLOSE + b"Expect: 100-continue\r\n" + LENGTH % len(SEED)), 0.2), (SEED, 0)],
        both((100, b""), (200, b"")),
        id="expect-100-continue-then-body",
    ),
    pytest.param(
        [(request("GET", b"/v2", CLOSE + b"".join(b"X-Header-%d: %d\r\n" % (i, i) for i in range(10_000))), 0)],
        # 190 KB of headers: past the 64 KiB head (app/server/http/heads.py), on either parser
        both(HEAD_TOO_LARGE),
        id="headers-10000",
    ),
    pytest.param(
        [(request("GET", URL, CLOSE), 0)],
        both(HEAD_TOO_LARGE),  # the request line alone is past 64 KiB
        id="url-64KiB",
    ),
    pytest.param(
        [
            (
                request("POST", b"/normalize", LENGTH % len(SEED), SEED)
                + request("POST", b"/v2/models/layernorm/infer", LENGTH % len(v2_seed()), v2_seed())
                + request("GET", b"/v2/health/ready", CLOSE),
                0,
            )
        ],
        both((200, b""), (200, b""), (200, b'{"ready":true}')),
        id="pipelined-3",
    ),
    pytest.param(
        [(request("POST", b"/normalize", CLOSE + b"Transfer-Encoding: chunked\r\n", chunked(BIG)), 0)],
        both(TOO_LARGE),
        id="chunked-over-the-limit",
    ),
    pytest.param(
        [(request("POST", b"/v2/models/layernorm/infer", CLOSE + b"Transfer-Encoding: chunked\r\n", chunked(BIG)), 0)],
        both(TOO_LARGE),
        id="chunked-over-the-limit-v2",
    ),
    pytest.param(
        [(request("POST", b"/normalize", LENGTH % (len(SEED) + 100), SEED), 0)],
        both(TOO_SLOW),  # the rest never comes: 408 at the deadline, and the socket closed
        id="body-stops-halfway",
    ),
    pytest.param(
        [(request("POST", b"/v2/models/layernorm/infer", b"Transfer-Encoding: chunked\r\n", b"10\r\n" + SEED[:10]), 0)],
        both(TOO_SLOW),
        id="chunked-body-stops-halfway",
    ),
    pytest.param(
        [(request("POST", b"/normalize", b"Transfer-Encoding: chunked\r\n", b"zz\r\n" + SEED), 0)],
        both(UVICORN_400),
        id="chunk-size-not-hex",
    ),
    pytest.param(
        [(request("POST", b"/nowhere", b"Content-Length: 100000\r\n"), 0.1), *[(b"x", 0.1)] * 5],
        # answered without reading the body: closed at once rather than read for as long as the client trickles
        both((404, b'{"error":"no route POST /nowhere"}')),
        id="unread-body-trickled",
    ),
]


def as_expected(answers: list[tuple[int, bytes]], expected: list[tuple[int, bytes | str]]) -> bool:
    if [status for status, _ in answers] != [status for status, _ in expected]:
        return False
    bodies = [
        (got, want.encode() if isinstance(want, str) else want)
        for (_, got), (_, want) in zip(answers, expected, strict=True)
    ]
    return all(want in (b"", got) for got, want in bodies)


@pytest.mark.parametrize(("parts", "expected"), CASES)
def test_http_abuse_gets_its_documented_status_and_the_server_goes_on(
    abused: Server, runtime: Runtime, parts: list[tuple[bytes, float]], expected: dict[str, Any]
) -> None:
    got = exchange(abused, parts)
    assert as_expected(got.answers, expected[abused.parser]), got.answers
    assert got.closed, "the server keeps a connection it answered and should have closed"
    assert abused.proc.poll() is None, "the worker is gone"
    assert_still_right(abused.client, "/normalize", runtime)
    assert_still_right(abused.client, "/v2/models/encoder/infer", runtime)
