"""scripts/pinned_ab.py: the table of medians per checkout (its cells are benchmarks/pinned.py's, tested there)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import pinned_ab


def test_table_gives_the_median_of_the_rounds_per_case_and_checkout() -> None:
    figures = {
        (case, name): [(100.0 * k, 0.5 * k), (300.0 * k, 1.5 * k), (200.0 * k, 9.0 * k)]
        for case in pinned_ab.CASES
        for k, name in ((1, "before"), (2, "after"))
    }
    rows = pinned_ab.table(figures, ["before", "after"]).splitlines()
    assert rows[0] == "| case | before req/s | before CPU ms/req | after req/s | after CPU ms/req |"
    assert rows[2:] == [f"| {case} | 200.0 | 1.500 | 400.0 | 3.000 |" for case in pinned_ab.CASES]
