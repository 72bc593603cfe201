"""BYTES tensors sent raw, as Triton lays them out: each element a 4-byte little-endian length, then its bytes.

The HTTP codec's binary sections and gRPC's raw_input_contents carry them alike (app/server/api/v2/elements.py's
from_raw hands them here); gRPC's typed bytes_contents come as elements already and only need utf8.
"""

from __future__ import annotations

from app.errors import InvalidInput, MalformedBody


def from_raw(raw: memoryview | bytes, field: str, element: str) -> list[str]:
    """The elements of a BYTES tensor's raw bytes, as str: a length past the end is refused naming the byte count's
    field, invalid UTF-8 naming the element (`element`[i], e.g. inputs.text[2])."""
    data, at = bytes(raw), 0
    items: list[str] = []
    while at < len(data):
        if at + 4 > len(data):
            raise MalformedBody(
                f"{len(data) - at} bytes left after element {len(items) - 1}; expected a 4-byte length", field
            )
        n = int.from_bytes(data[at : at + 4], "little")
        if at + 4 + n > len(data):
            raise MalformedBody(f"element {len(items)} declares {n} bytes, but {len(data) - at - 4} follow", field)
        items.append(utf8(data[at + 4 : at + 4 + n], f"{element}[{len(items)}]"))
        at += 4 + n
    return items


def utf8(value: bytes, field: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInput(f"invalid UTF-8 at byte {e.start}; expected UTF-8 text", field) from None
