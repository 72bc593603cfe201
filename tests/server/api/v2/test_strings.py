"""strings.py: BYTES tensors' raw layout (a 4-byte little-endian length, then the bytes) read back; every message
whole, naming the byte count's field or the element."""

from __future__ import annotations

import pytest

from app.errors import InvalidInput, MalformedBody
from app.server.api.v2 import strings

FIELD = "inputs.text.parameters.binary_data_size"


def _packed(*items: bytes) -> bytes:
    return b"".join(len(item).to_bytes(4, "little") + item for item in items)


@pytest.mark.parametrize(
    "items",
    [[], ["a"], ["", "héllo", "日本語"], ["x" * 300, ""]],
)
def test_elements_are_read_back_in_order(items: list[str]) -> None:
    raw = _packed(*(item.encode() for item in items))
    assert strings.from_raw(memoryview(raw), FIELD, "inputs.text") == items


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_packed(b"ab") + b"\x01\x00", f"{FIELD}: 2 bytes left after element 0; expected a 4-byte length"),
        (b"\x00", f"{FIELD}: 1 bytes left after element -1; expected a 4-byte length"),
        ((9).to_bytes(4, "little") + b"ab", f"{FIELD}: element 0 declares 9 bytes, but 2 follow"),
        (_packed(b"ok") + (3).to_bytes(4, "little"), f"{FIELD}: element 1 declares 3 bytes, but 0 follow"),
    ],
)
def test_a_length_past_the_end_is_refused_naming_the_byte_count(raw: bytes, message: str) -> None:
    with pytest.raises(MalformedBody) as e:
        strings.from_raw(raw, FIELD, "inputs.text")
    assert e.value.message == message


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_packed(b"\xff"), "inputs.text[0]: invalid UTF-8 at byte 0; expected UTF-8 text"),
        (_packed(b"fine", b"ab\xc3"), "inputs.text[1]: invalid UTF-8 at byte 2; expected UTF-8 text"),
    ],
)
def test_invalid_utf8_is_refused_naming_the_element(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidInput) as e:
        strings.from_raw(raw, FIELD, "inputs.text")
    assert e.value.message == message


@pytest.mark.parametrize(("value", "text"), [(b"", ""), (b"caf\xc3\xa9", "café")])
def test_utf8_decodes_valid_text(value: bytes, text: str) -> None:
    assert strings.utf8(value, "inputs.text[0]") == text
