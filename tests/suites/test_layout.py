"""The code-size rule of app/: no module over 300 lines, no function or method over 40 lines.

A function's length runs from its `def` line to the last line of its body (decorators not counted), as `ast`
gives them; nested functions and methods count on their own too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 40
MODULES = sorted(APP.rglob("*.py"))


def function_lengths(tree: ast.Module) -> dict[str, int]:
    """{qualified name (Class.method, outer.inner): lines from `def` to the end of the body} of every function."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    lengths[f"{name} (line {child.lineno})"] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return lengths


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_app_has_modules() -> None:
    assert len(MODULES) > 10, f"no Python modules found under {APP}"


@pytest.mark.parametrize("path", MODULES, ids=_id)
def test_module_is_at_most_300_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{_id(path)} has {lines} lines (at most {MAX_MODULE_LINES})"


@pytest.mark.parametrize("path", MODULES, ids=_id)
def test_functions_are_at_most_40_lines(path: Path) -> None:
    lengths = function_lengths(ast.parse(path.read_text(), filename=str(path)))
    too_long = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES}
    listed = ", ".join(f"{name}: {n} lines" for name, n in sorted(too_long.items(), key=lambda kv: -kv[1]))
    assert not too_long, f"{_id(path)}: over {MAX_FUNCTION_LINES} lines: {listed}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n    pass\n", {"f (line 1)": 2}),
        ("@decorator\n@other(1)\ndef f():\n    a = 1\n    return a\n", {"f (line 3)": 3}),
        (
            "class C:\n    async def m(self):\n        def inner():\n            pass\n",
            {"C.m (line 2)": 3, "C.m.inner (line 3)": 2},
        ),
        ("def f(\n    a,\n    b,\n):\n    '''Doc.'''\n\n    return a\n", {"f (line 1)": 7}),
    ],
)
def test_function_lengths_count_from_def_to_the_end_of_the_body(source: str, expected: dict[str, int]) -> None:
    assert function_lengths(ast.parse(source)) == expected
