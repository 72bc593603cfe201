"""JSON bodies whose float tensors go straight from simdjson's tape into NumPy, never through Python lists.

`orjson.loads` builds one Python float (24 bytes) and one list slot (8 bytes) per number:
a 64 MiB body of floats became ~390 MiB of objects and took 3.5 s, measured. Here simdjson
parses the body once, each tensor comes out of its tape as one float64 buffer, and only the
small fields become Python objects. A body over 16 MiB has its top-level tensor parsed in
pieces, so simdjson's copy of the text and its tape exist for one piece at a time.

This is only a fast path. Anything it is not sure of (invalid JSON, a non-number, a ragged
or too-deep array, a tensor of booleans) returns None or leaves that value as Python lists,
and the callers then take the orjson path, whose checks write every error message. The one
verdict it gives itself is a key repeated in one object (app/core/jsonkeys.py), which orjson
cannot see. A ragged array of many short rows of numbers is the exception that costs: as lists
it took 2 s to name (a million rows of two), so its text names its first wrong row
(rowshape.text_row_problem, in the words the codec's own check uses) and the codec refuses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import simdjson

from app.core.jsonkeys import STRING_TOKEN, duplicate_key
from app.core.rowshape import Ragged, skeleton, text_row_problem
from app.core.tensors import collector_paused

Path = tuple[str | int, ...]


class _Unsure(Exception):
    """The fast path cannot tell; the caller parses with orjson instead."""


# Past this many innermost lists, rectangularity is checked on the array's minified text, not row by row: the walk
# costs ~115 ns a row and holds a proxy object per row, the text ~17 ns a number (measured); a million rows of two
# took 2.5 s to decode while the walk refused them and the array went through Python lists.
_SHORT_ROWS = 1 << 16
# What a number's text may hold (simdjson's minified text writes each as digits, sign, point and exponent): deleted,
# a rectangular array of numbers leaves only its brackets and commas, which its shape alone determines.
_NUMBER_CHARS = b"0123456789+-.eE"
# NumPy 1 has at most 32 dims (NumPy 2: 64) and reshape raises past them; the checked path's depth limit refuses these.
_MAX_RANK = 32
# _convert recurses twice per level (itself and its comprehension): bounded far below Python's recursion limit
# and orjson's 255 levels, and far above any request's fields (V2: inputs[i].parameters.<name> is 4 deep).
_MAX_DEPTH = 64
# simdjson finds a key by a linear scan, so converting an object costs keys²: 100,000 keys took 13 s of CPU.
# No request has more than a dozen per object; orjson parses larger objects in linear time.
_MAX_KEYS = 64
# A body past this has its largest top-level tensor parsed a piece at a time: simdjson's copy of the whole body
# and its tape (16 bytes a number) took the peak of a 61 MiB /normalize to 4.2x the body, with the body still held.
_SPLIT_BYTES = 1 << 24
_PIECE_BYTES = 1 << 22
_WS = b" \t\r\n"


def loads(
    body: bytes | bytearray | memoryview, is_tensor: Callable[[Path], bool], taken: Callable[[], None] | None = None
) -> Any | None:
    """The document, with each numeric array at a path where is_tensor holds as a float64 ndarray; None = fall back.

    taken() runs once the document is sure to be taken, before the float64 buffers are built: a caller done
    with the body releases it there, so the body, simdjson's padded copy and tape and the buffers never all
    coexist (a 61 MiB body of floats peaked at 5x itself with all four)."""
    if len(body) > _SPLIT_BYTES and not isinstance(body, memoryview):
        doc = _loads_split(body, is_tensor, taken or (lambda: None))
        if doc is not None:
            return doc
    try:
        root = simdjson.Parser().parse(body)
    except (ValueError, TypeError, RuntimeError):  # invalid JSON: orjson names the problem
        return None
    lists = [0]  # '[' of the arrays converted to NumPy, which the skeleton below no longer shows
    try:
        doc = _convert(root, (), is_tensor, lists)
    except _Unsure:
        return None
    try:
        # Every '[' outside the tensors, strings and keys included, and those of the tensors left as lists
        skeleton = orjson.dumps(doc, default=lambda v: v.value if isinstance(v, _Lists) else 0)
    except orjson.JSONEncodeError:  # a non-numeric tensor left as lists nested past orjson's 255 levels
        return None
    # A numeric array may hide an extra level ([1, [2]] flattens to the same buffer as [1, 2]); the
    # body's '[' count equals lists + the skeleton's only when every tensor is exactly its shape.
    if _count_open_brackets(body) != lists[0] + skeleton.count(b"["):
        return None
    if taken is not None:
        taken()
    # Each tensor matched its shape (the count above), so a buffer can only fail on a non-number, and the
    # array is then its lists, as the count already assumed: no fallback to the body is needed from here.
    return _materialize(doc)


class _Tensor:
    """A rectangular array of numbers found by _convert, turned into its buffer only once the document is taken."""

    def __init__(self, node: simdjson.Array, shape: list[int]) -> None:
        self.node = node
        self.shape = shape

    def value(self) -> Any:
        try:
            flat = np.frombuffer(self.node.as_buffer(of_type="d"), dtype=np.float64)
        except (TypeError, ValueError):  # a boolean, null or string among the numbers; or a number out of range
            return self.node.as_list()  # the codec's own checks explain what is wrong
        return flat.reshape(self.shape)


class _Lists:
    """A tensor that is not a rectangular array of numbers, as Python lists: held whole, so that neither the
    skeleton's dump nor _materialize walks its elements in Python (3 s for a million rows of two, measured)."""

    def __init__(self, node: simdjson.Array) -> None:
        with collector_paused():
            self.value = node.as_list()


def _materialize(doc: Any) -> Any:
    if isinstance(doc, _Tensor):
        return doc.value()
    if isinstance(doc, _Lists):
        return doc.value
    if isinstance(doc, dict):
        return {key: _materialize(value) for key, value in doc.items()}
    if isinstance(doc, list):
        return [_materialize(value) for value in doc]
    return doc


def _convert(node: Any, path: Path, is_tensor: Callable[[Path], bool], lists: list[int]) -> Any:
    if len(path) > _MAX_DEPTH:
        raise _Unsure
    if isinstance(node, simdjson.Object):
        keys = list(node.keys())  # not items(): it would turn every value into Python objects
        if len(keys) > _MAX_KEYS:
            raise _Unsure
        if len(set(keys)) != len(keys):
            # Sure of this one: refused here, before the last copy (orjson keeps it) breaks some other rule
            # and the answer names that rule instead, as `"name"` twice in inputs[0] did.
            raise duplicate_key(next(k for i, k in enumerate(keys) if k in keys[:i]))
        if any("\x00" in key for key in keys):
            raise _Unsure  # simdjson looks a key up as a C string, which a NUL cuts short: it would not find it
        return {key: _convert(node[key], (*path, key), is_tensor, lists) for key in keys}
    if isinstance(node, simdjson.Array):
        if is_tensor(path):
            return _tensor(node, lists)
        return [_convert(value, (*path, i), is_tensor, lists) for i, value in enumerate(node)]
    return node


def _tensor(node: simdjson.Array, lists: list[int]) -> _Tensor | _Lists | Ragged:
    """A tensor's array: its numbers to be read as one buffer when it is rectangular, else its first problem
    when its text shows a ragged array of numbers, else its Python lists (the codec's own checks explain what
    is wrong with booleans, strings, nulls, arrays where numbers go)."""
    shape = _first_shape(node)
    if shape is None:
        return _Lists(node)
    if math.prod(shape[:-1]) <= _SHORT_ROWS:
        if not _rows_fit(node, shape):
            return _Lists(node)
    else:
        text = _minified(node)
        structure = text.translate(None, _NUMBER_CHARS)
        # An empty list leaves what a list of one number leaves: "[]" (minified, and with no strings in an array
        # that matched, it can only be one)
        if structure != skeleton(shape) or (shape[-1] == 1 and b"[]" in text):
            # Numbers, brackets and commas only: a ragged array of numbers, named from its text
            problem = None if structure.translate(None, b"[],") else text_row_problem(text, shape)
            if problem is None:
                return _Lists(node)
            lists[0] += structure.count(b"[")
            return Ragged(len(shape), problem)
    lists[0] += sum(math.prod(shape[:d]) for d in range(len(shape)))  # 1 + d0 + d0*d1 + ...
    return _Tensor(node, shape)


def _first_shape(node: simdjson.Array) -> list[int] | None:
    """The shape of the first elements of an array, when the first of them all is a number; or None."""
    shape: list[int] = []
    probe: Any = node
    while isinstance(probe, simdjson.Array):
        if len(probe) == 0:
            return None
        shape.append(len(probe))
        if len(shape) > _MAX_RANK:
            raise _Unsure
        probe = probe[0]
    if isinstance(probe, bool) or not isinstance(probe, int | float):
        return None
    return shape


def _rows_fit(node: simdjson.Array, shape: list[int]) -> bool:
    """Whether every list above the numbers holds lists of the expected length."""
    level = [node]
    for size in shape[1:]:
        children = []
        for parent in level:
            for child in parent:
                if not isinstance(child, simdjson.Array) or len(child) != size:
                    return False
                children.append(child)
        level = children
    return True


def _minified(node: simdjson.Array) -> bytes:
    text: bytes | str = node.mini  # bytes at run time (pysimdjson 7), though its stub says str
    return text if isinstance(text, bytes) else text.encode()


def _count_open_brackets(body: bytes | bytearray | memoryview) -> int:
    if not isinstance(body, memoryview):
        return body.count(b"[")
    step = 1 << 22  # bounded copies: a 64 MiB view is never duplicated whole
    return sum(bytes(body[i : i + step]).count(b"[") for i in range(0, len(body), step))


def _loads_split(body: bytes | bytearray, is_tensor: Callable[[Path], bool], taken: Callable[[], None]) -> Any | None:
    """The document with its first top-level tensor parsed piece by piece, or None (then parsed whole).

    Same document as the whole parse, or None: the pieces are valid arrays joined by commas, and the rest
    of the body (with 0 in the tensor's place) is valid JSON checked as the whole body would be. The
    pieces are joined once the body is released (taken)."""
    found = _top_level_array(body, is_tensor)
    if found is None:
        return None
    key, start, end = found
    parts = _pieces(body, start, end)
    if parts is None:
        return None
    doc = loads(bytes(body[:start]) + b"0" + bytes(body[end:]), is_tensor)
    if not isinstance(doc, dict) or type(doc.get(key)) is not int:
        return None
    taken()
    doc[key] = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return doc


def _top_level_array(body: bytes | bytearray, is_tensor: Callable[[Path], bool]) -> tuple[str, int, int] | None:
    """(key, start, end) of the first value of the root object that is_tensor takes and that opens with '['."""
    depth, pos = 0, 0
    for n, token in enumerate(STRING_TOKEN.finditer(body)):
        if n > 2 * _MAX_KEYS:
            return None
        depth += body.count(b"{", pos, token.start()) - body.count(b"}", pos, token.start())
        pos = token.end()
        after = len(body[pos : pos + 64]) - len(body[pos : pos + 64].lstrip(_WS))
        if depth != 1 or body[pos + after : pos + after + 1] != b":":
            continue  # not a key of the root object (a valid body's colon follows its key within a few spaces)
        start = pos + after + 1
        start += len(body[start : start + 64]) - len(body[start : start + 64].lstrip(_WS))
        try:
            key = orjson.loads(token.group())
        except orjson.JSONDecodeError:  # not a valid string: the whole parse says why
            return None
        if body[start : start + 1] != b"[" or not isinstance(key, str) or not is_tensor((key,)):
            continue
        following = STRING_TOKEN.search(body, start)
        end = body.rfind(b"]", start, following.start() if following else len(body)) + 1
        return (key, start, end) if end - start > _PIECE_BYTES else None
    return None


def _pieces(body: bytes | bytearray, start: int, end: int) -> list[np.ndarray] | None:
    """The array body[start:end] as float64 pieces of about _PIECE_BYTES of its text each; None when unsure."""
    nested = body[start + 1 : start + 65].lstrip(_WS)[:1] == b"["
    last = end - 1  # the closing ']'
    parts: list[np.ndarray] = []
    first, depth, known = start + 1, 1, start + 1
    while True:
        cut = last if last - first <= _PIECE_BYTES else body.find(b",", first + _PIECE_BYTES, last)
        while nested and 0 <= cut < last:  # the comma must separate two items of the outer array
            depth += body.count(b"[", known, cut) - body.count(b"]", known, cut)
            known = cut
            if depth == 1:
                break
            closing = body.find(b"]", cut, last)
            cut = body.find(b",", closing, last) if closing >= 0 else -1
        cut = last if cut < 0 else cut
        part = _whole_array(b"[" + bytes(body[first:cut]) + b"]")
        if part is None or (parts and part.shape[1:] != parts[0].shape[1:]):
            return None
        parts.append(part)
        if cut == last:
            break
        first = cut + 1
    return parts


def _whole_array(text: bytes) -> np.ndarray | None:
    """A rectangular array of numbers, exactly its shape, or None."""
    tensor = loads(text, lambda path: path == ())
    return tensor if isinstance(tensor, np.ndarray) else None
