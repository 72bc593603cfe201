"""Answers after which a kept-alive connection ends say so (`Connection: close`), and binary answers go out
uncompressed (issue 22, items 6 and 7; spec section 11), on real uvicorn servers over raw sockets.

A 500 needs a bug: `faulty_app` (served with uvicorn's --factory) is the real app whose DataPlane.infer raises,
and which has one more route that raises, so both ways an unexpected error is answered are covered: the
inference routes' hot path and FastAPI's ServerErrorMiddleware.
"""

from __future__ import annotations

import gzip
import json
import signal
import socket
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from app.core.reference import layer_norm
from benchmarks.servers import server_process as command_process
from benchmarks.servers import uvicorn_command
from tests.live_server import server_env, server_process
from tests.suites.test_drain import ONE_THREAD, encoder_request
from tests.suites.test_http_abuse import request

HEADER_LENGTH = "Inference-Header-Content-Length"
LN = "/v2/models/layernorm/infer"
X = np.random.default_rng(22).standard_normal((64, 256)).astype(np.float32)


def faulty_app() -> FastAPI:
    """The real app, with a bug on the hot path (every inference raises) and a route that raises."""
    from app.server.app import create_app

    app = create_app()

    async def broken(codec: Any, body: Any, *args: Any, **kwargs: Any) -> Any:
        body.close()  # the body's read, never awaited
        raise RuntimeError("a bug on the hot path")

    def boom() -> None:
        raise RuntimeError("a bug behind FastAPI's middleware")

    app.state.worker.plane.infer = broken
    app.add_api_route("/boom", boom)
    return app


def answer_and_close(address: tuple[str, int], raw: bytes) -> tuple[int, dict[bytes, bytes], bool]:
    """Send raw on a new connection; the status, headers, and whether the server then closed the connection."""
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(raw)
        return answer_on(s, linger=2)


def answer_on(s: socket.socket, linger: float = 10) -> tuple[int, dict[bytes, bytes], bool]:
    """The answer read from s: its status, headers, and whether the server closed the connection within linger
    seconds of its head."""
    data = b""
    s.settimeout(10)
    while b"\r\n\r\n" not in data:
        data += s.recv(1 << 16)
    s.settimeout(linger)
    try:
        while chunk := s.recv(1 << 16):
            data += chunk
        closed = True
    except TimeoutError:
        closed = False
    head = data.partition(b"\r\n\r\n")[0].split(b"\r\n")
    headers = {k.lower(): v for k, v in (line.split(b": ", 1) for line in head[1:])}
    return int(head[0].split()[1]), headers, closed


def address(base: str) -> tuple[str, int]:
    host, port = base.removeprefix("http://").split(":")
    return host, int(port)


NORMALIZE = b'{"data": [[1.0, 2.0, 3.0]]}'


@pytest.mark.parametrize(
    "raw",
    [
        request("POST", b"/normalize", b"Content-Length: %d\r\n" % len(NORMALIZE), NORMALIZE),
        request("GET", b"/boom"),
    ],
    ids=["hot-path", "fastapi"],
)
def test_a_500_says_connection_close_and_the_connection_ends(raw: bytes) -> None:
    command = uvicorn_command("--log-level", "critical", "--factory", app=f"{__name__}:faulty_app")
    with command_process(command, env=server_env({"NORMSERVE_LOG_LEVEL": "critical"})) as server:
        status, headers, closed = answer_and_close(address(server.base), raw)
        assert (status, headers.get(b"connection"), closed) == (500, b"close", True)
        with httpx.Client(base_url=server.base, timeout=10) as client:  # the next, unrelated request is served
            assert client.get("/v2/health/live").status_code == 200


@pytest.mark.slow
def test_503s_while_draining_say_connection_close_on_kept_alive_connections() -> None:
    body, headers = encoder_request(48)  # seconds of onnxruntime: the drain waits for it
    with server_process(ONE_THREAD) as (base, proc):
        host, port = address(base)
        kept = [socket.create_connection((host, port), timeout=30) for _ in range(2)]
        for s in kept:  # one answered request each first: kept-alive connections, as a client's pool holds
            s.sendall(request("GET", b"/v2/health/live"))
            assert s.recv(1 << 16).startswith(b"HTTP/1.1 200")
        long = threading.Thread(
            target=lambda: httpx.post(base + "/v2/models/encoder/infer", content=body, headers=headers, timeout=120)
        )
        long.start()
        time.sleep(0.5)  # the long request is in flight
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        kept[0].sendall(request("GET", b"/v2/health/ready"))
        kept[1].sendall(request("POST", LN.encode(), b"Content-Length: %d\r\n" % len(NORMALIZE), NORMALIZE))
        for s in kept:
            status, answer_headers, closed = answer_on(s)
            assert (status, answer_headers.get(b"connection"), answer_headers.get(b"retry-after"), closed) == (
                503,
                b"close",
                b"1",
                True,
            )
            s.close()
        long.join()


def v2_request(binary_output: bool) -> tuple[bytes, dict[str, str]]:
    tensor = {"name": "input", "shape": list(X.shape), "datatype": "FP32", "parameters": {"binary_data_size": X.nbytes}}
    head = json.dumps(
        {"inputs": [tensor], "outputs": [{"name": "output", "parameters": {"binary_data": binary_output}}]}
    )
    return head.encode() + X.tobytes(), {HEADER_LENGTH: str(len(head))}


def output_of(r: httpx.Response) -> np.ndarray:
    if HEADER_LENGTH in r.headers:
        n = int(r.headers[HEADER_LENGTH])
        return np.frombuffer(r.content[n:], np.float32).reshape(X.shape)
    return np.reshape(r.json()["outputs"][0]["data"], X.shape)


DECOMPRESS: dict[str | None, Callable[[bytes], bytes]] = {
    "gzip": gzip.decompress,
    "deflate": zlib.decompress,
    None: lambda b: b,
}


@pytest.mark.parametrize(
    ("binary_output", "accept", "encoding"),
    [
        (True, "gzip", None),
        (True, "deflate", None),
        (True, "gzip, deflate, br, zstd", None),
        (False, "gzip", "gzip"),
        (False, "deflate", "deflate"),
        (False, "identity", None),
    ],
    ids=["binary-gzip", "binary-deflate", "binary-httpx-default", "json-gzip", "json-deflate", "json-identity"],
)
def test_binary_answers_go_out_uncompressed_and_json_follows_accept_encoding(
    server: str, binary_output: bool, accept: str, encoding: str | None
) -> None:
    body, headers = v2_request(binary_output)
    with (
        httpx.Client(base_url=server, timeout=30, headers={"Accept-Encoding": accept}) as client,
        client.stream("POST", LN, content=body, headers=headers) as r,
    ):
        raw = b"".join(r.iter_raw())
    assert (r.status_code, r.headers.get("content-encoding")) == (200, encoding)
    plain = httpx.Response(
        200, headers={k: v for k, v in r.headers.items() if k != "content-encoding"}, content=DECOMPRESS[encoding](raw)
    )
    np.testing.assert_allclose(output_of(plain), layer_norm(X.astype(np.float64)).output, atol=1e-4)
