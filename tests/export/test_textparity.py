"""app/export/textparity.py: the parity texts and the figures recorded from them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.export.textparity import BUILT_IN, figures, read_texts, texts


@pytest.mark.parametrize("max_len", [8, 256])
def test_the_built_in_texts_end_with_one_of_more_words_than_the_maximum_length(max_len: int) -> None:
    got = texts(max_len, None)
    assert got[: len(BUILT_IN)] == list(BUILT_IN)
    assert len(got) == len(BUILT_IN) + 1 and len(got[-1].split()) == max_len + 1  # a word is at least one token


def test_the_check_texts_are_one_a_line_after_the_built_in_ones(tmp_path: Path) -> None:
    file = tmp_path / "mine.txt"
    file.write_text("première ligne\n\n   \n二行目\n", encoding="utf-8")
    assert texts(16, file)[-2:] == ["première ligne", "二行目"]


def test_a_check_texts_file_with_no_text_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "empty.txt"
    file.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError) as refused:
        texts(16, file)
    assert str(refused.value) == f"--check-texts {file}: no text in it; expected one text a line"


@pytest.mark.parametrize("flag", ["--check-texts", "--calibration"])
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot be read (No such file or directory)"),
        (b"\n \n", "no text in it; expected one text a line"),
        (b"ok\n\xff\n", "not UTF-8 (byte 0xff at offset 3)"),
    ],
    ids=["missing", "blank", "not-utf8"],
)
def test_a_texts_file_that_gives_no_texts_is_refused_naming_its_flag(
    tmp_path: Path, flag: str, content: bytes | None, message: str
) -> None:
    file = tmp_path / "texts.txt"
    if content is not None:
        file.write_bytes(content)
    with pytest.raises(ValueError) as refused:
        read_texts(file, flag)
    assert str(refused.value) == f"{flag} {file}: {message}"


def test_a_texts_file_is_its_non_blank_lines_in_order(tmp_path: Path) -> None:
    file = tmp_path / "texts.txt"
    file.write_bytes("  first \r\n\nsecond ✓\n".encode())
    assert read_texts(file, "--calibration") == ["  first ", "second ✓"]


@pytest.mark.parametrize(
    ("got", "want", "cosine", "max_abs"),
    [
        ([[1.0, 0.0], [0.0, 2.0]], [[1.0, 0.0], [0.0, 2.0]], 1.0, 0.0),
        ([[1.0, 0.0], [1.0, 1.0]], [[1.0, 0.0], [1.0, 0.0]], 2**-0.5, 1.0),  # the worst row's cosine, 45 degrees
        ([[3.0, 4.0]], [[6.0, 8.0]], 1.0, 4.0),  # same direction, twice the length: cosine 1, abs shows it
    ],
    ids=["equal", "worst-row", "scaled"],
)
def test_figures_are_the_worst_cosine_and_the_max_abs(
    got: list[list[float]], want: list[list[float]], cosine: float, max_abs: float
) -> None:
    result = figures(np.array(got, np.float32), np.array(want, np.float64))
    assert result == pytest.approx({"cosine": cosine, "max_abs": max_abs}, abs=1e-12)
