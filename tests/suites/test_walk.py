"""scripts/walk.py: who imports whom (directly or through others), and the counts a walk reports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import walk


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "app"


def test_importers_follow_imports_through_other_modules_and_inside_functions(tmp_path: Path) -> None:
    app = _tree(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/core/__init__.py": "",
            "app/core/low.py": "import numpy\n",
            "app/server/__init__.py": "",
            "app/server/mid.py": "from app.core import low\n",
            "app/server/top.py": "def f():\n    from app.server.mid import g\n",
        },
    )
    above = walk.importers(app)
    assert above["app/core/low.py"] == {"app/server/mid.py", "app/server/top.py"}
    assert above["app/server/mid.py"] == {"app/server/top.py"}
    assert "app/server/top.py" not in above


@pytest.mark.parametrize(
    ("files", "climbs", "expected"),
    [
        (["a.py", "b.py", "a.py"], [], {"files": 2, "stays": 3, "climbs": 0}),
        (["a.py"], ["a.py -> b.py:f", "a.py -> b.py:g"], {"files": 1, "stays": 1, "climbs": 2}),
    ],
)
def test_report_counts_distinct_files_stays_and_climbs(
    files: list[str], climbs: list[str], expected: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    assert walk.report("r", files, climbs) == expected
    assert capsys.readouterr().out.splitlines()[0] == (
        f"r: {expected['files']} files, {expected['stays']} stays, {expected['climbs']} climbs back up"
    )
