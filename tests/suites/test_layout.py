"""The layout rules of app/: no module over 300 lines, no function over 40 lines, a test module for every module.

A function's length runs from its `def` line to the last line of its body (decorators not counted), as `ast`
gives them; nested functions and methods count on their own too. The test module of app/<dir>/<name>.py is
tests/<dir>/test_<name>.py; what crosses modules is in tests/suites/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 40
TESTS = ROOT / "tests"
MODULES = sorted(APP.rglob("*.py"))
TESTED_MODULES = [path for path in MODULES if path.name != "__init__.py"]


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


def mirrored_test(module: Path, app: Path = APP, tests: Path = TESTS) -> Path:
    """tests/<dir>/test_<name>.py for app/<dir>/<name>.py."""
    relative = module.relative_to(app)
    return tests / relative.parent / f"test_{relative.name}"


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


@pytest.mark.parametrize("path", TESTED_MODULES, ids=_id)
def test_module_has_its_mirrored_test_module(path: Path) -> None:
    test = mirrored_test(path)
    assert test.is_file(), f"{_id(path)} has no test module: expected {_id(test)}"


@pytest.mark.parametrize(
    ("module", "test"),
    [
        ("app/main.py", "tests/test_main.py"),
        ("app/cli/main.py", "tests/cli/test_main.py"),
        ("app/server/telemetry/metrics.py", "tests/server/telemetry/test_metrics.py"),
        ("app/server/api/metrics.py", "tests/server/api/test_metrics.py"),
        ("app/server/api/rest/routes.py", "tests/server/api/rest/test_routes.py"),
    ],
)
def test_the_mirrored_test_module_keeps_the_path_and_prefixes_the_name(module: str, test: str) -> None:
    assert mirrored_test(ROOT / module) == ROOT / test


def test_the_mirrored_test_check_can_fail(tmp_path: Path) -> None:
    app, tests = tmp_path / "app", tmp_path / "tests"
    (app / "core").mkdir(parents=True)
    (app / "core" / "tested.py").touch()
    (app / "core" / "untested.py").touch()
    (tests / "core").mkdir(parents=True)
    (tests / "core" / "test_tested.py").touch()
    found = {m.name: mirrored_test(m, app, tests).is_file() for m in sorted((app / "core").glob("*.py"))}
    assert found == {"tested.py": True, "untested.py": False}
