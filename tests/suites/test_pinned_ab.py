"""scripts/pinned_ab.py: a process's CPU from /proc and the table of medians per checkout."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import pinned_ab


def test_cpu_seconds_grows_by_the_cpu_this_process_burns() -> None:
    before, start = pinned_ab.cpu_seconds(os.getpid()), time.process_time()
    while time.process_time() - start < 0.3:
        pass
    # /proc counts in clock ticks (10 ms here): the burn shows within a few ticks of process_time's own count.
    assert abs((pinned_ab.cpu_seconds(os.getpid()) - before) - (time.process_time() - start)) < 0.05


def test_table_gives_the_median_of_the_rounds_per_case_and_checkout() -> None:
    figures = {
        (case, name): [(100.0 * k, 0.5 * k), (300.0 * k, 1.5 * k), (200.0 * k, 9.0 * k)]
        for case in pinned_ab.CASES
        for k, name in ((1, "before"), (2, "after"))
    }
    rows = pinned_ab.table(figures, ["before", "after"]).splitlines()
    assert rows[0] == "| case | before req/s | before CPU ms/req | after req/s | after CPU ms/req |"
    assert rows[2:] == [f"| {case} | 200.0 | 1.500 | 400.0 | 3.000 |" for case in pinned_ab.CASES]
