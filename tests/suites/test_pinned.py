"""benchmarks/pinned.py: a server's CPU from /proc with its children, the headline table, the targets it feeds.

The pinned cells themselves run against real servers in test_bench_smoke.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks/ lives beside app/ in the checkout

from benchmarks import pinned, servers  # noqa: E402
from benchmarks.targets import evaluate  # noqa: E402

# A parent that starts a child burning 0.4 s of CPU; both wait on their stdin, so the test ends them.
BURN = "import sys, time; t = time.process_time()\nwhile time.process_time() - t < 0.4: pass\nsys.stdin.read()"
PARENT = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BURN!r}])"


def test_cpu_seconds_grows_by_the_cpu_this_process_burns() -> None:
    before, start = servers.cpu_seconds(os.getpid()), time.process_time()
    while time.process_time() - start < 0.3:
        pass
    # /proc counts in clock ticks (10 ms here): the burn shows within a few ticks of process_time's own count.
    assert abs((servers.cpu_seconds(os.getpid()) - before) - (time.process_time() - start)) < 0.05


def test_tree_cpu_seconds_counts_a_live_child_the_process_alone_does_not() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while pinned.tree_cpu_seconds(parent.pid) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pinned.tree_cpu_seconds(parent.pid) >= 0.4
        assert servers.cpu_seconds(parent.pid) < 0.3  # the burn is the child's, counted through the tree
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(timeout=30)


def _cell(server: str, shape: tuple[int, ...], conc: int, rps: float, cpu_ms: float) -> dict[str, Any]:
    return {
        "server": server,
        "protocol": pinned.protocol_of(server),
        "shape": shape,
        "concurrency": conc,
        "rps": rps,
        "cpu_ms_per_request": cpu_ms,
        "p50_ms": 1.0,
        "p99_ms": 2.0,
        "errors": 0,
        "requests": 100,
    }


RESULTS: dict[str, Any] = {
    "meta": {"versions": {"kserve (own venv)": "0.21.0", "mlserver (own venv)": "not run"}},
    "pinned": {
        "server_cpu": 0,
        "load_cpu": 1,
        "rounds": 3,
        "seconds": 10.0,
        "cells": [
            _cell("normserve", (1, 8, 64), 8, 2000.0, 0.5),
            _cell("trivial", (1, 8, 64), 8, 20000.0, 0.05),
            _cell("naive", (1, 8, 64), 8, 250.0, 4.0),
            _cell("kserve", (1, 8, 64), 8, 400.0, 2.5),
            _cell("normserve", (8, 128, 768), 1, 12.0, 80.0),
            _cell("naive", (8, 128, 768), 1, 0.3, 3300.0),
            _cell("kserve", (8, 128, 768), 1, 0.6, 1600.0),
        ],
    },
}


def test_the_headline_puts_cpu_per_request_beside_every_req_per_second_and_each_ratio() -> None:
    heading, _, table = pinned.headline(RESULTS)
    assert heading == "## Headline: the cost per core, each server pinned to one core\n"
    assert table.splitlines() == [
        "| case | normserve | trivial ASGI app | naive FastAPI | KServe 0.21.0 | goal |",
        "|---|---|---|---|---|---|",
        "| /normalize JSON (1,8,64) c=8 | 2,000.0 req/s, 0.5 ms CPU | 20,000.0 req/s, 0.05 ms CPU (ours 10.0x its CPU)"
        " | 250.0 req/s, 4 ms CPU (ours 8.0x its req/s, 0.12x its CPU) | 400.0 req/s, 2.5 ms CPU (ours 5.0x its req/s, 0.20x its CPU) "
        "| req/s >= 10x / 10x / 6x (naive FastAPI, KServe, MLServer); CPU <= 6x the trivial app's |",
        "| /normalize JSON (8,128,768) c=1 | 12.0 req/s, 80 ms CPU | - | 0.3 req/s, 3,300 ms CPU (ours 40.0x its req/s, 0.02x its CPU) "
        "| 0.6 req/s, 1,600 ms CPU (ours 20.0x its req/s, 0.05x its CPU) | req/s >= 30x / 30x / 4x (naive FastAPI, KServe, MLServer) |",
    ]


def test_no_pinned_figures_no_headline() -> None:
    assert pinned.headline({"meta": {}}) == []


@pytest.mark.parametrize(
    ("target", "measured", "verdict"),
    [
        ("/normalize JSON (1, 8, 64) c=8 (pinned): server CPU per request <= 6x the trivial ASGI app's",
         "0.5 vs 0.05 ms", "**missed**"),
        ("/normalize JSON (1, 8, 64) c=8 (pinned): req/s >= 10x naive FastAPI",
         "2000.0 vs 250.0 req/s = 8.0x", "**missed**"),
        ("/normalize JSON (1, 8, 64) c=8 (pinned): req/s >= 10x KServe V2 JSON",
         "2000.0 vs 400.0 req/s = 5.0x", "**missed**"),
        ("/normalize JSON (1, 8, 64) c=8 (pinned): req/s >= 6x MLServer V2 JSON",
         "not measured in this run", "-"),
        ("/normalize JSON (8, 128, 768) c=1 (pinned): req/s >= 30x naive FastAPI",
         "12.0 vs 0.3 req/s = 40.0x", "met"),
        ("/normalize JSON (8, 128, 768) c=1 (pinned): req/s >= 30x KServe V2 JSON",
         "12.0 vs 0.6 req/s = 20.0x", "**missed**"),
    ],
)  # fmt: skip
def test_the_targets_compare_the_pinned_cells_with_the_issue_goals(target: str, measured: str, verdict: str) -> None:
    rows = {row[0]: row for row in evaluate(RESULTS)}
    assert rows[target][1] == measured
    assert rows[target][3] == verdict


def test_a_cell_with_failed_requests_says_how_many() -> None:
    cell = {**_cell("normserve", (1, 8, 64), 8, 2000.0, 0.5), "errors": 3}
    table = pinned.headline({"pinned": {**RESULTS["pinned"], "cells": [cell]}})[2]
    assert "| /normalize JSON (1,8,64) c=8 | 2,000.0 req/s, 0.5 ms CPU, 3 failed | " in table
