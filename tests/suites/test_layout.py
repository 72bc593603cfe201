"""The layout rules: no module of app/ or benchmarks/ over 300 lines, no function there or in scripts/ over 40 lines;
a test module for every module of app/, and a line for each in README's Layout.

A function's length runs from its `def` line to the last line of its body (decorators not counted), as `ast`
gives them; nested functions and methods count on their own too. The test module of app/<dir>/<name>.py is
tests/<dir>/test_<name>.py; what crosses modules is in tests/suites/.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 40
TESTS = ROOT / "tests"
APP_MODULES = sorted(APP.rglob("*.py"))
MODULES = APP_MODULES + sorted((ROOT / "benchmarks").rglob("*.py"))
# scripts/ keeps the function rule alone: scripts/fidelity.py (the grid, its measurements, its report) is ~390 lines.
FUNCTION_MODULES = MODULES + sorted((ROOT / "scripts").glob("*.py"))
TESTED_MODULES = [path for path in APP_MODULES if path.name != "__init__.py"]
# A Layout entry starts its line: in a tree or a list (`app/x.py  what it does`) or a table (`| app/x.py | ... |`).
LAYOUT_ENTRY = re.compile(r"^[\s|*`-]*(app/[\w./-]*)")


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


def tracked_app_files(root: Path = ROOT) -> set[str]:
    """The files under app/ that git tracks, as repository paths; the files on disk where git is not (a tarball)."""
    try:
        listed = subprocess.run(["git", "ls-files", "app"], cwd=root, capture_output=True, text=True, timeout=30)
    except OSError:
        listed = None
    if listed is not None and listed.returncode == 0 and listed.stdout.strip():
        return set(listed.stdout.split())
    on_disk = (p for p in (root / "app").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return {str(p.relative_to(root)) for p in on_disk}


def layout_entries(readme: str) -> set[str]:
    """The app/ paths that start a line of README's Layout section (up to the next `## ` heading)."""
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for line in section.splitlines() if (m := LAYOUT_ENTRY.match(line))}


def layout_mismatch(entries: set[str], tracked: set[str]) -> tuple[list[str], list[str]]:
    """(modules the Layout misses, entries that name nothing tracked): every module but __init__.py is listed."""
    modules = {path for path in tracked if path.endswith(".py") and not path.endswith("/__init__.py")}
    folders = {str(Path(path).parent) + "/" for path in tracked}
    stale = sorted(entry for entry in entries if entry not in tracked and entry not in folders)
    return sorted(modules - entries), stale


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_app_has_modules() -> None:
    assert len(APP_MODULES) > 10, f"no Python modules found under {APP}"


def test_readme_layout_lists_every_module_of_app_and_nothing_else() -> None:
    missing, stale = layout_mismatch(layout_entries((ROOT / "README.md").read_text()), tracked_app_files())
    assert (missing, stale) == ([], []), f"README's Layout misses {missing}; lists what app/ does not hold: {stale}"


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ("app/main.py    the app\napp/core/a.py  math", {"app/main.py", "app/core/a.py"}),
        ("| `app/core/a.py` | math |\n| --- | --- |", {"app/core/a.py"}),
        ("- app/server/static/  the playground:\n  index.html, app.js", {"app/server/static/"}),
        ("models/   the repository\ntests/    app/core/a.py's tests", set()),
    ],
)
def test_layout_entries_are_the_app_paths_that_start_a_line(lines: str, expected: set[str]) -> None:
    readme = f"# normserve\napp/not/layout.py\n## Layout\n\n```\n{lines}\n```\n\n## Next\napp/after.py  no\n"
    assert layout_entries(readme) == expected


def test_layout_mismatch_names_the_missing_and_the_stale_entries() -> None:
    tracked = {"app/__init__.py", "app/main.py", "app/core/a.py", "app/core/b.py", "app/static/index.html"}
    entries = {"app/main.py", "app/core/a.py", "app/core/gone.py", "app/static/", "app/static/index.html"}
    assert layout_mismatch(entries, tracked) == (["app/core/b.py"], ["app/core/gone.py"])


def test_tracked_app_files_fall_back_to_the_files_on_disk_outside_git(tmp_path: Path) -> None:
    (tmp_path / "app" / "core" / "__pycache__").mkdir(parents=True)
    (tmp_path / "app" / "core" / "a.py").touch()
    (tmp_path / "app" / "core" / "__pycache__" / "a.cpython-312.pyc").touch()
    assert tracked_app_files(tmp_path) == {"app/core/a.py"}


@pytest.mark.parametrize("path", MODULES, ids=_id)
def test_module_is_at_most_300_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{_id(path)} has {lines} lines (at most {MAX_MODULE_LINES})"


@pytest.mark.parametrize("path", FUNCTION_MODULES, ids=_id)
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
