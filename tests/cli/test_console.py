"""app/cli/console.py: step lines on stderr (with a live bar in a terminal) and the parity table."""

from __future__ import annotations

import io
import re
from typing import Literal

from rich.console import Console

from app.cli.console import Steps, parity_table
from app.cli.validate import Check

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CHECKS = [
    Check("layernorm", "var k=1", 1.8e-7, 1.03e-5),
    Check("encoder", "encode, validate: true", 2e-4, 1e-4),
    Check("encoder-preln", "nan", float("nan"), 1.0),
]


def _console(terminal: bool, width: int = 100) -> tuple[Console, io.StringIO]:
    """A console as the CLI's (no highlighting) writing to a buffer, in a terminal or a pipe."""
    buffer = io.StringIO()
    colors: Literal["standard"] | None = "standard" if terminal else None
    console = Console(file=buffer, width=width, force_terminal=terminal, color_system=colors, highlight=False)
    return console, buffer


def test_parity_table_renders_a_row_per_check_with_its_figures() -> None:
    console, buffer = _console(terminal=False)
    console.print(parity_table(CHECKS, "parity against NumPy: models"))
    assert buffer.getvalue().splitlines() == [
        "                        parity against NumPy: models                         ",
        "┏━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━┓",
        "┃ model         ┃ check                  ┃ max abs diff ┃     atol ┃ result ┃",
        "┡━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━┩",
        "│ layernorm     │ var k=1                │     1.80e-07 │ 1.03e-05 │ pass   │",
        "│ encoder       │ encode, validate: true │     2.00e-04 │ 1.00e-04 │ FAIL   │",
        "│ encoder-preln │ nan                    │          nan │ 1.00e+00 │ FAIL   │",
        "└───────────────┴────────────────────────┴──────────────┴──────────┴────────┘",
    ]


def test_parity_table_colours_pass_green_and_fail_bold_red_in_a_terminal() -> None:
    console, buffer = _console(terminal=True)
    console.print(parity_table(CHECKS[:2], "t"))
    out = buffer.getvalue()
    assert "│ \x1b[32mpass\x1b[0m   │" in out
    assert "│ \x1b[1;31mFAIL\x1b[0m   │" in out


def test_parity_table_of_no_checks_has_the_header_alone() -> None:
    console, buffer = _console(terminal=False)
    console.print(parity_table([], "nothing"))
    lines = buffer.getvalue().splitlines()
    assert lines[2] == "┃ model ┃ check ┃ max abs diff ┃ atol ┃ result ┃"
    assert len(lines) == 5  # title, top rule, header, header rule, bottom rule


def test_steps_in_a_pipe_print_one_numbered_line_each_and_nothing_else() -> None:
    console, buffer = _console(terminal=False, width=20)
    with Steps("validate", total=3, console=console) as step:
        step("a message that is longer than twenty columns")
        step("[bold]markup[/] is printed as it is")
    assert (
        buffer.getvalue()
        == "[1/3] a message that is longer than twenty columns\n[2/3] [bold]markup[/] is printed as it is\n"
    )
    assert step.count == 2


def test_steps_without_a_total_number_the_lines_alone() -> None:
    console, buffer = _console(terminal=False)
    with Steps("export", console=console) as step:
        step("exporting layernorm")
        step("exporting encoder")
    assert buffer.getvalue() == "[1] exporting layernorm\n[2] exporting encoder\n"


def test_steps_in_a_terminal_also_show_a_bar_with_the_step_under_way() -> None:
    console, buffer = _console(terminal=True, width=80)
    with Steps("export", total=2, console=console) as step:
        step("one")
        step("two")
    out = ANSI.sub("", buffer.getvalue())
    assert "[1/2] one\n" in out and "[2/2] two\n" in out
    assert re.search(r"export: two .* 1/2 ", out), out  # the bar: the current step, one of two done


def test_steps_that_never_start_show_no_bar() -> None:
    console, buffer = _console(terminal=True)
    with Steps("validate", total=2, console=console):
        pass
    assert buffer.getvalue() == ""
