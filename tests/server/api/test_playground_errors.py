"""The playground in Chromium: a JSON error points into the textarea the user typed, and rounded rows are said.

The service's message counts characters of the request body the page built around the user's text; the page
shows that message as it is, and under it the line, column and token in the user's own box, selected there.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page

from tests.server.api.test_playground import browser, page, settle  # noqa: F401  (fixtures: Chromium, loaded page)


def run_with(page: Page, fields: dict[str, str]) -> None:  # noqa: F811
    page.click("#example-seed003")
    if {"#gamma", "#beta"} & set(fields):
        page.click("#affine summary")
    for selector, value in fields.items():
        page.fill(selector, value)
    settle(page, lambda: page.click("#run"))


def selected(page: Page, box: str) -> str:  # noqa: F811
    return page.eval_on_selector(box, "e => e.value.slice(e.selectionStart, e.selectionEnd)")


@pytest.mark.parametrize(
    ("fields", "box", "where", "token"),
    [
        ({"#data": "[[0.2, 0.1, 0.3],\n [0.5, NaN, 0.1]]"}, "#data", "line 2, column 8", "NaN"),
        ({"#data": "\n\n  [[1, Infinity]]"}, "#data", "line 3, column 8", "Infinity"),  # the box is sent trimmed
        ({"#data": "[[1, 2,]]"}, "#data", "line 1, column 7", ","),
        ({"#data": '[["😀", NaN]]'}, "#data", "line 1, column 8", "NaN"),  # the service counts characters
        ({"#gamma": "[1, two, 3]"}, "#gamma", "line 1, column 5", "two"),
        ({"#beta": "[0, 0,\n  0,, 1]"}, "#beta", "line 2, column 5", ","),
    ],
    ids=["nan-line-2", "leading-blank-lines", "trailing-comma", "astral-character", "gamma", "beta"],
)
def test_a_json_error_is_shown_at_its_place_in_the_users_box(
    page: Page,  # noqa: F811
    fields: dict[str, str],
    box: str,
    where: str,
    token: str,
) -> None:
    run_with(page, fields)
    shown = page.text_content("#error") or ""
    assert shown.startswith("400 Bad Request: body: not valid JSON (")  # the service's own message, as it is
    assert page.is_visible("#error-where")
    assert page.text_content("#error-where") == f"In the {box[1:]} box: {where}, at “{token}”."
    assert selected(page, box) == token
    assert page.evaluate("document.activeElement.id") == box[1:]


def test_a_box_whose_text_ends_too_soon_is_pointed_at_its_end(page: Page) -> None:  # noqa: F811
    run_with(page, {"#data": "[[0.2, 0.1, 0.3],\n [0.5, 0.1, 0.1]"})
    assert page.text_content("#error-where") == (
        "In the data box: its text ends at line 2, column 17, before its JSON does."
    )


def test_the_pointer_goes_once_the_text_is_fixed(page: Page) -> None:  # noqa: F811
    run_with(page, {"#data": "[[1, NaN]]"})
    assert page.is_visible("#error-where")
    run_with(page, {"#data": "[[1, 2]]"})
    assert page.is_hidden("#error-where") and page.is_hidden("#error")


def test_errors_that_are_not_json_errors_have_no_pointer(page: Page) -> None:  # noqa: F811
    run_with(page, {"#data": "[[0.2, 0.1, 0.3], [0.5, 0.1]]"})
    assert (page.text_content("#error") or "").endswith("data: row 1 has 2 elements, expected 3")
    assert page.is_hidden("#error-where")


ROUNDED = (
    "data: row [1]: its values differ but all round to the same float32, 100000000.0, "
    "so its var is 0 and its normalized values are 0"
)


def test_rows_rounded_to_one_float32_value_are_said_above_the_results(page: Page) -> None:  # noqa: F811
    run_with(page, {"#data": "[[0.2, 0.1, 0.3], [1e8, 100000001, 100000002]]"})
    assert page.is_visible("#warnings")
    assert page.eval_on_selector_all("#warnings li", "els => els.map(e => e.textContent)") == [ROUNDED]
    assert page.eval_on_selector_all("#stats-table td.var", "els => els.map(e => e.textContent)")[1] == "0"
    run_with(page, {})  # seed 003 again: nothing to say
    assert page.is_hidden("#warnings")
