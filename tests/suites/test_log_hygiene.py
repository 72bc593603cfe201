"""Text from a request never breaks a log record or an error message: one record is one line of JSON, and the
404 `no route` message is cut and escaped as every other message is."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import orjson
import pytest

from tests.server.api.v2.grpc.live import GrpcServer, grpc_server

# Characters a line splitter, a terminal or a log viewer reads as something else than text.
HOSTILE = {
    "line-separator": "\u2028",
    "paragraph-separator": "\u2029",
    "right-to-left-override": "\u202e",
    "next-line": "\x85",
    "zero-width-space": "\u200b",
    "byte-order-mark": "\ufeff",
    "tag-character": "\U000e0041",
    "delete": "\x7f",
}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    with grpc_server(tmp_path_factory.mktemp("hygiene"), {"NORMSERVE_LOG_LEVEL": "info"}) as server:
        yield server


def _lines(log: Path) -> list[str]:
    """What a log shipper splits the file into: str.splitlines splits at U+2028, U+2029 and U+0085 too."""
    return log.read_text().splitlines()


@pytest.mark.parametrize("char", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_path_is_one_line_of_json_in_the_access_log(live: GrpcServer, char: str) -> None:
    rid = uuid.uuid4().hex
    path = f"/v2/models/a{char}b/ready/x"
    r = httpx.get(live.base + quote(path), headers={"X-Request-ID": rid}, timeout=30)
    assert r.status_code == 404
    line = live.request_line(rid)  # waits for the line to be written
    records = [orjson.loads(text) for text in _lines(live.log) if text.startswith("{") and rid in text]
    assert records == [line]
    assert line["path"] == path  # escaped in the file, the client's exact characters once parsed
    raw = next(text for text in _lines(live.log) if rid in text)
    assert raw.isprintable()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/nowhere\u202eexe.txt", "no route GET /nowhere\\u202eexe.txt"),
        ("/a\u2028b", "no route GET /a\\u2028b"),
        ("/" + "x" * 5000, "no route GET /" + "x" * (1000 - len("no route GET /") - 1) + "…"),
    ],
    ids=["bidi-override", "line-separator", "5000-chars"],
)
def test_the_no_route_message_is_escaped_and_cut_to_1000_characters(live: GrpcServer, path: str, message: str) -> None:
    r = httpx.get(live.base + quote(path), timeout=30)
    assert (r.status_code, r.json()) == (404, {"error": message})
    assert len(r.json()["error"]) <= 1000
