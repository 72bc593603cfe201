"""Reading request bodies: size limits before and after decompression, and Content-Type checks."""

from __future__ import annotations

import asyncio
import zlib

from starlette.requests import ClientDisconnect, Request

from app.errors import BodyTimeout, MalformedBody, PayloadTooLarge, UnsupportedMediaType
from app.server.http.compression import WBITS
from app.settings import Settings


def require_json(request: Request) -> None:
    """An absent Content-Type is fine (raw HTTP clients may send none); anything but JSON is a 415 (curl -d sends
    a form type unless -H sets JSON)."""
    ctype = request.headers.get("content-type")
    if ctype is None:
        return
    media = ctype.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise UnsupportedMediaType(f"Content-Type {media!r} is not supported; send application/json", "content-type")


async def read_body(request: Request, settings: Settings) -> bytearray:
    """The whole body within NORMSERVE_BODY_TIMEOUT_S, never more than NORMSERVE_MAX_BODY_BYTES (see _read).

    Without a deadline a client sending a byte a second held its socket (and its worker's memory) for as
    long as it liked: 1,500 of them were held open indefinitely."""
    deadline = asyncio.timeout(settings.body_timeout_s)
    try:
        async with deadline:
            return await _read(request, settings.max_body_bytes)
    except TimeoutError:
        if not deadline.expired():
            raise
        limit = f"{settings.body_timeout_s:g} s (NORMSERVE_BODY_TIMEOUT_S)"
        raise BodyTimeout(f"did not arrive in full within {limit}", "body") from None


async def _read(request: Request, max_bytes: int) -> bytearray:
    """The whole body, decompressed per Content-Encoding, never holding more than max_bytes (+ one chunk)."""
    too_large = f"body exceeds {max_bytes} bytes (NORMSERVE_MAX_BODY_BYTES)"
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise PayloadTooLarge(too_large, "body")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "", *WBITS):
        raise UnsupportedMediaType(f"Content-Encoding {encoding!r} is not supported; use gzip or deflate", "body")
    inflater = zlib.decompressobj(WBITS[encoding]) if encoding in WBITS else None
    body = bytearray()
    try:
        async for chunk in request.stream():
            if inflater is None:
                body += chunk
            else:
                _inflate(inflater, chunk, body, max_bytes, too_large)
            if len(body) > max_bytes:
                raise PayloadTooLarge(too_large, "body")
    except ClientDisconnect:  # a routine event, not a server error: answered (to no one) as a bad body
        raise MalformedBody("the client closed the connection before sending the whole body", "body") from None
    if inflater is not None:
        _inflate(inflater, b"", body, max_bytes, too_large)
        if not inflater.eof:
            raise MalformedBody(f"truncated {encoding} stream", "body")
    return body


def _inflate(inflater: zlib._Decompress, data: bytes, body: bytearray, max_bytes: int, too_large: str) -> None:
    # max_length bounds each step, so a small bomb never expands past the limit in memory.
    try:
        while True:
            body += inflater.decompress(data, max_bytes + 1 - len(body))
            if len(body) > max_bytes:
                raise PayloadTooLarge(too_large + " after decompression", "body")
            data = inflater.unconsumed_tail
            if not data:
                return
    except zlib.error as e:
        raise MalformedBody(f"invalid compressed data ({e})", "body") from None
