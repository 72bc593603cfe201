"""Where a nested JSON array stops being rectangular: the first ragged row or misplaced element, named by its
index, found on Python lists (first_problem) or on the array's minified text (text_row_problem) in the same words.

Both screen a level at a time at C speed before looking at any one node: an error message must not cost a
request more than its decoding would have.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np


class Ragged:
    """An array of numbers found not rectangular on its text (app/core/jsontensors.py), before it became Python
    lists: its rank (the depth of its first number) and its first problem, which decode_json_tensor names.
    (Not a dataclass: orjson would serialize one, where the fast path's skeleton needs it to be a placeholder.)"""

    __slots__ = ("ndim", "problem")

    def __init__(self, ndim: int, problem: str) -> None:
        self.ndim = ndim
        self.problem = problem


def describe_mismatch(value: Any, expected: str = "a number") -> str:
    """Find the first place a nested list stops being a rectangular array of `expected` (error path only)."""
    return first_problem(value, expected, leaves=True) or "not a rectangular array of numbers"


def first_problem(value: Any, expected: str, leaves: bool) -> str | None:
    """The first node, level by level, that is not where a rectangular array of the first elements' shape has
    one (and with `leaves`, the first element that is not `expected`); None if there is none."""
    shape = []
    probe = value
    while isinstance(probe, list):
        shape.append(len(probe))
        probe = probe[0] if probe else None
    # Level by level, each a flat list, screened at C speed (types and lengths) before any node is looked at in
    # Python: a million rows of two took 1.1 s in a call per node, 0.1 s screened (measured).
    level = [value]
    for depth in range(len(shape) + 1 if leaves else len(shape)):
        for i in _suspects(level, depth, shape, expected):
            problem = _node_problem(level[i], depth, shape, expected)
            if problem is not None:
                return _placed(problem, i, depth, shape)
        if depth < len(shape):
            level = list(itertools.chain.from_iterable(level))
    return None


def _suspects(level: list[Any], depth: int, shape: list[int], expected: str) -> Iterator[int]:
    """The positions in a level where _node_problem may find something, in order (a superset: it decides)."""
    if depth < len(shape):
        if set(map(type, level)) == {list} and set(map(len, level)) == {shape[depth]}:
            return iter(())
        size = shape[depth]
        return (i for i, node in enumerate(level) if type(node) is not list or len(node) != size)
    if expected == "a boolean":
        return (i for i, node in enumerate(level) if type(node) is not bool)
    kinds = set(map(type, level))
    if kinds <= {float, int} and (int not in kinds or (-(2**63) <= min(level) and max(level) < 2**64)):
        return iter(())
    return (
        i
        for i, node in enumerate(level)
        if type(node) is not float and (type(node) is not int or not -(2**63) <= node < 2**64)
    )


def _node_problem(node: Any, depth: int, shape: list[int], expected: str) -> str | None:
    """What is wrong with one node at a depth, as a template of {index} / {where}; None if nothing."""
    if depth == len(shape):
        if isinstance(node, list):
            return f"element {{index}} is an array, expected {expected}"
        if expected == "a boolean":
            return None if isinstance(node, bool) else f"element {{index}} is {_json_type(node)}, expected {expected}"
        if isinstance(node, bool) or not isinstance(node, int | float):
            return f"element {{index}} is {_json_type(node)}, expected {expected}"
        if isinstance(node, int) and not -(2**63) <= node < 2**64:
            return "element {index} is an integer outside 64 bits, expected a float32 number"
        return None
    if not isinstance(node, list):
        return _row_problem(_json_type(node), 0, shape[depth])
    return _row_problem(None, len(node), shape[depth])


def _row_problem(kind: str | None, length: int, size: int) -> str | None:
    """A row that is a `kind` (not an array), or an array of `length` where `size` was expected; or None."""
    if kind is not None:
        return f"row {{where}} is {kind}, expected an array of {size}"
    return f"row {{where}} has {length} elements, expected {size}" if length != size else None


def _placed(problem: str, i: int, depth: int, shape: list[int]) -> str:
    """A problem at position i of its level: every level above was rectangular, so i unravels over shape[:depth]."""
    index = [int(j) for j in np.unravel_index(i, shape[:depth])] if depth else []
    return problem.format(index=index, where=index[0] if depth == 1 else index)


def skeleton(shape: list[int]) -> bytes:
    """The minified text of a rectangular array of that shape with its numbers deleted: [[,],[,]] for [2, 2]."""
    item = b""
    for size in reversed(shape):
        item = b"[" + (item + b",") * (size - 1) + item + b"]"
    return item


def text_row_problem(text: bytes, shape: list[int]) -> str | None:
    """The first row, level by level, of the minified text of an array whose first numbers have `shape`, that is
    not a row of a rectangular array of that shape; None if there is none above the numbers. The text holds
    numbers, brackets and commas only. As first_problem (the same rows, the same words) without a Python object
    per row: a million ragged rows of two became 3 million objects to be named (0.3 s), here NumPy's passes."""
    chars = np.frombuffer(text, np.uint8)
    opens, commas = chars == ord("["), chars == ord(",")
    # How many lists are open after each character: '[' of a level-k list (the root is level 0) reads k + 1.
    # int16: a row may nest past the first numbers' depth, up to simdjson's 1,024 levels (int8 wrapped at 128).
    steps = opens.astype(np.int16) - (chars == ord("]"))
    depth = np.cumsum(steps, dtype=np.int16)
    del steps
    inside = depth == 1
    for level in range(1, len(shape)):
        # The rows of this level, in order: what follows each '[' (unless it closes at once) and each comma
        # of the lists one level up.
        starts = np.flatnonzero((opens | commas) & inside) + 1
        starts = starts[chars[starts] != ord("]")]
        rows = chars[starts] == ord("[")
        # Each row that is a list: its commas + 1 elements (each comma is its list's, the last opened before
        # it), or none
        inside = depth == level + 1
        own = np.searchsorted(starts[rows], np.flatnonzero(commas & inside)) - 1
        lengths = np.bincount(own, minlength=int(rows.sum())) + 1
        lengths[chars[starts[rows] + 1] == ord("]")] = 0
        sizes = np.full(len(starts), -1)
        sizes[rows] = lengths
        bad = np.flatnonzero(sizes != shape[level])
        if len(bad):
            i = int(bad[0])
            problem = _row_problem(None if rows[i] else "a number", int(sizes[i]), shape[level])
            assert problem is not None
            return _placed(problem, i, level, shape)
    return None


def _json_type(node: Any) -> str:
    if node is None:
        return "null"
    if isinstance(node, bool):
        return "a boolean"
    if isinstance(node, str):
        return "a string"
    if isinstance(node, dict):
        return "an object"
    if isinstance(node, int | float):
        return "a number"
    return type(node).__name__
