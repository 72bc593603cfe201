"""Where a nested JSON array stops being rectangular: the same first problem, in the same words, on lists and on text."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from app.core.rowshape import describe_mismatch, first_problem, skeleton, text_row_problem


def _first_shape(value: Any) -> list[int]:
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        value = value[0]
    return shape


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([[1, 2], [3]], "row 1 has 1 elements, expected 2"),
        ([[1, 2], 3], "row 1 is a number, expected an array of 2"),
        ([[1], [2, 3]], "row 1 has 2 elements, expected 1"),
        ([[[1, 2], [3, 4]], [[5, 6], [7]]], "row [1, 1] has 1 elements, expected 2"),
        ([[1, 2], [3, 4]], None),
    ],
)
def test_a_ragged_array_names_its_first_wrong_row_alike_on_lists_and_on_text(value: Any, message: str | None) -> None:
    assert first_problem(value, "a number", leaves=False) == message
    assert text_row_problem(orjson.dumps(value), _first_shape(value)) == message


@pytest.mark.parametrize(
    ("value", "expected", "message"),
    [
        ([[1, "a"]], "a number", "element [0, 1] is a string, expected a number"),
        ([[1, None]], "a number", "element [0, 1] is null, expected a number"),
        ([[True, 1]], "a boolean", "element [0, 1] is a number, expected a boolean"),
        ([[1], [2]], "a number", "not a rectangular array of numbers"),
    ],
)
def test_a_mismatch_names_its_first_wrong_element(value: Any, expected: str, message: str) -> None:
    assert describe_mismatch(value, expected) == message


@pytest.mark.parametrize(
    ("shape", "text"), [([3], b"[,,]"), ([2, 2], b"[[,],[,]]"), ([1, 1], b"[[]]"), ([2, 1, 2], b"[[[,]],[[,]]]")]
)
def test_the_skeleton_is_a_rectangular_arrays_text_without_its_numbers(shape: list[int], text: bytes) -> None:
    numbers = orjson.dumps(np.full(shape, -1.5e-3), option=orjson.OPT_SERIALIZE_NUMPY)
    assert skeleton(shape) == numbers.translate(None, b"0123456789+-.eE") == text
