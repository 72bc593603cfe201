"""Duplicate keys in JSON objects, which orjson (like most parsers) resolves silently by keeping the last.

A body such as `{"data": [1, 2], "data": [3, 4]}` means different things to different parsers (a
proxy that validates the first `data`, a server that uses the last), so requests with a repeated
key are refused. The scan runs after the request has been validated: by then tensors are plain
numbers, the strings are only keys and a few small values, and the cost is one C-speed pass
(a regex with a literal first character, and bytes.find for braces) over the body.
"""

from __future__ import annotations

import re

import orjson

from app.errors import InvalidInput

# A JSON string token; possessive quantifiers keep long runs of escapes linear.
STRING_TOKEN = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"')
_COLON = re.compile(rb"[ \t\r\n]*:")


def first_duplicate_key(text: bytes | bytearray, end: int | None = None) -> str | None:
    """The first key repeated within one object of the valid JSON `text[:end]`, or None."""
    end = len(text) if end is None else end
    objects: list[set[str]] = []  # the keys seen in each open object, innermost last
    pos = 0
    for token in STRING_TOKEN.finditer(text, 0, end):
        _braces(text, pos, token.start(), objects)
        pos = token.end()
        if objects and _COLON.match(text, pos, end):
            key = orjson.loads(token.group())
            if key in objects[-1]:
                return str(key)
            objects[-1].add(key)
    return None


def _braces(text: bytes | bytearray, start: int, stop: int, objects: list[set[str]]) -> None:
    """Open and close objects for the braces between two strings (tensors have none: two finds)."""
    while True:
        opening, closing = text.find(b"{", start, stop), text.find(b"}", start, stop)
        if opening < 0 and closing < 0:
            return
        if closing < 0 or 0 <= opening < closing:
            objects.append(set())
            start = opening + 1
        else:
            if objects:
                objects.pop()
            start = closing + 1


def check_unique_keys(text: bytes | bytearray, end: int | None = None) -> None:
    """InvalidInput naming the first key that a JSON object of the request repeats."""
    key = first_duplicate_key(text, end)
    if key is not None:
        raise duplicate_key(key)


def duplicate_key(key: str) -> InvalidInput:
    """The refusal of a repeated key, wherever it is found (here, or by the fast path of app/core/jsontensors.py)."""
    return InvalidInput("given more than once in one object; send each field once", key[:64])
