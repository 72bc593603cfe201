"""app/core/jsonkeys.py: the first key an object repeats, per object, with keys compared as JSON decodes them."""

from __future__ import annotations

import pytest

from app.core.jsonkeys import check_unique_keys, first_duplicate_key
from app.errors import InvalidInput

CASES = [
    pytest.param(b'{"data": [1, 2], "data": [3, 4]}', "data", id="top-level"),
    pytest.param(b'{"a":1,"a":2}', "a", id="no-spaces"),
    pytest.param(b'{ "a" \n : 1, "a"\t: 2}', "a", id="whitespace-before-colon"),
    pytest.param(b'{"a": {"b": 1, "b": 2}}', "b", id="nested-object"),
    pytest.param(b'{"a": {"b": 1}, "b": 2}', None, id="same-key-inner-and-outer"),
    pytest.param(b'{"a": {"b": 1}, "c": {"b": 2}}', None, id="same-key-in-sibling-objects"),
    pytest.param(b'{"outer": {"inner": {"k": 1}, "k": 2}, "k": 3}', None, id="same-key-at-three-depths"),
    pytest.param(b'[{"a": 1}, {"a": 2}]', None, id="array-of-objects"),
    pytest.param(b'[{"a": 1, "a": 2}]', "a", id="repeat-inside-an-array-element"),
    pytest.param(
        b'{"inputs": [{"name": "input", "data": [1]}, {"name": "gamma"}], "inputs": []}', "inputs", id="v2-inputs"
    ),
    pytest.param(b'{"ab": 1, "a\\u0062": 2}', "ab", id="escaped-spelling-of-the-same-key"),
    pytest.param(b'{"\\u00e9": 1, "\\u00E9": 2}', "\u00e9", id="unicode-escapes-in-either-case"),
    pytest.param(b'{"a\\"b": 1, "a\\"b": 2}', 'a"b', id="escaped-quote"),
    pytest.param(b'{"a\\\\": 1, "a\\\\": 2}', "a\\", id="escaped-backslash-before-the-closing-quote"),
    pytest.param(b'{"a\\\\": 1, "a": 2}', None, id="escaped-backslash-is-another-key"),
    pytest.param(b'{"a": "}", "a": 1}', "a", id="closing-brace-inside-a-string"),
    pytest.param(b'{"a": "{", "b": 1, "b": 2}', "b", id="opening-brace-inside-a-string"),
    pytest.param(b'{"x": ["a", "b"], "y": "x"}', None, id="string-values-are-not-keys"),
    pytest.param(b'{"a": "a"}', None, id="value-equal-to-its-key"),
    pytest.param(b"{}", None, id="empty-object"),
    pytest.param(b"[[1, 2], [3, 4]]", None, id="no-object"),
    pytest.param(b'"a"', None, id="a-string"),
]


@pytest.mark.parametrize(("text", "key"), CASES)
def test_first_duplicate_key(text: bytes, key: str | None) -> None:
    assert first_duplicate_key(text) == key
    assert first_duplicate_key(bytearray(text)) == key  # request bodies arrive as bytearray


def test_only_the_text_before_end_is_scanned() -> None:
    text = b'{"a": 1, "a": 2}'
    assert first_duplicate_key(text, end=text.index(b", ")) is None
    assert first_duplicate_key(text, end=len(text)) == "a"


def test_the_first_repeat_in_the_text_is_named() -> None:
    assert first_duplicate_key(b'{"z": {"y": 1, "y": 2}, "z": 3, "x": 4, "x": 5}') == "y"


@pytest.mark.parametrize(("text", "key"), [case for case in CASES if case.values[1] is None])
def test_check_unique_keys_accepts_objects_without_repeats(text: bytes, key: None) -> None:
    check_unique_keys(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b'{"data": [1], "data": [2]}', "data: given more than once in one object; send each field once"),
        (b'{"p": {"eps": 1, "eps": 2}}', "eps: given more than once in one object; send each field once"),
        (
            b'{"' + b"k" * 100 + b'": 1, "' + b"k" * 100 + b'": 2}',
            "k" * 64 + ": given more than once in one object; send each field once",
        ),
    ],
    ids=["top-level", "nested", "long-key-cut-to-64"],
)
def test_check_unique_keys_refuses_a_repeat_naming_the_key(text: bytes, message: str) -> None:
    with pytest.raises(InvalidInput) as e:
        check_unique_keys(text)
    assert str(e.value) == message
