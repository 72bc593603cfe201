"""app/server/http/compression.py: the encoding an Accept-Encoding asks for; gzip and deflate streams zlib reads."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable

import pytest

from app.server.http.compression import WBITS, choose_encoding, compress


@pytest.mark.parametrize(
    ("accept_encoding", "chosen"),
    [
        (None, None),
        ("", None),
        ("identity", None),
        ("br", None),
        ("*", None),  # identity is always acceptable; a wildcard does not oblige the server to compress
        ("x-gzip", None),  # accepted on requests only
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("GZIP", "gzip"),
        (" deflate ", "deflate"),
        ("gzip, deflate", "gzip"),
        ("deflate, gzip", "gzip"),  # gzip first, whatever the client's order
        ("deflate;q=1.0, gzip;q=0.1", "gzip"),  # any q > 0 accepts: q only refuses, it does not rank
        ("br, deflate", "deflate"),
        ("gzip;q=0", None),
        ("gzip;q=0.0, deflate", "deflate"),
        ("gzip; q=0, deflate; q=0", None),
        ("gzip;q=0.001", "gzip"),
        ("gzip;Q=0.5", "gzip"),
        ("gzip;q=abc, deflate", "deflate"),  # an unreadable q refuses
        ("gzip;level=9", "gzip"),  # a parameter other than q is ignored
        ("identity;q=0, deflate", "deflate"),
    ],
)
def test_choose_encoding(accept_encoding: str | None, chosen: str | None) -> None:
    assert choose_encoding(accept_encoding) == chosen


PARTS = [
    pytest.param((b'{"outputs": [', memoryview(b"1.0, 2.0" * 1000), b"]}"), id="bytes-and-memoryview"),
    pytest.param((b"only one part",), id="one-part"),
    pytest.param((b"", b""), id="empty"),
]


@pytest.mark.parametrize("parts", PARTS)
@pytest.mark.parametrize("encoding", ["gzip", "x-gzip", "deflate"])
def test_compress_round_trips_through_zlib(parts: tuple[bytes | memoryview, ...], encoding: str) -> None:
    stream = compress(parts, encoding)
    assert zlib.decompress(stream, WBITS[encoding]) == b"".join(parts)


@pytest.mark.parametrize(
    ("encoding", "decompress", "magic"),
    [
        ("gzip", gzip.decompress, b"\x1f\x8b"),  # the gzip format, as `Content-Encoding: gzip` says
        ("deflate", zlib.decompress, b"\x78"),  # the zlib format (RFC 1950), as tritonclient reads deflate
    ],
)
def test_compress_writes_the_format_each_encoding_names(
    encoding: str, decompress: Callable[[bytes], bytes], magic: bytes
) -> None:
    body = b"0.5, " * 10_000
    stream = compress((body[:7], body[7:]), encoding)
    assert stream.startswith(magic) and len(stream) < len(body) // 10
    assert decompress(stream) == body


def test_deflate_is_not_raw_deflate() -> None:
    with pytest.raises(zlib.error):
        zlib.decompress(compress((b"abc",), "deflate"), -zlib.MAX_WBITS)
