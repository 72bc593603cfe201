"""app/cli/http.py: one JSON call, the bearer token sent, the server's own error message on failure."""

from __future__ import annotations

import pytest

from app.cli import http
from tests.cli.normserve import closed_port


def test_a_json_answer_comes_back_parsed(server: str) -> None:
    assert http.call("GET", f"{server}/v2/health/ready") == {"ready": True}
    assert http.call("POST", f"{server}/normalize", {"data": [[1.0, 3.0]]})["output"] == [[-0.999995, 0.999995]]


def test_an_error_status_carries_the_servers_message(server: str) -> None:
    with pytest.raises(http.RequestFailed) as e:
        http.call("POST", f"{server}/normalize", {"data": [[1.0, 3.0]], "eps": -1}, token="ignored")
    assert str(e.value) == f"POST {server}/normalize: HTTP 422: eps: expected a finite number > 0, got -1.0"


def test_an_unreachable_server_is_named() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v2"
    with pytest.raises(http.RequestFailed) as e:
        http.call("GET", url)
    assert str(e.value) == f"cannot reach {url}: [Errno 111] Connection refused"


@pytest.mark.parametrize(("body", "error"), [(b'{"error": "x: y"}', "x: y"), (b"<html>", "<html>"), (b"", "no body")])
def test_error_of_reads_the_error_field_or_the_bodys_start(body: bytes, error: str) -> None:
    assert http.error_of(body) == error
