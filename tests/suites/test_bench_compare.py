"""scripts/bench_compare.py: two bench runs' pinned cells and target rows side by side, from their benchmarks.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.live_server import ROOT

SCRIPT = ROOT / "scripts" / "bench_compare.py"


def _cell(server: str, rps: float, cpu: float) -> dict[str, Any]:
    return {"server": server, "protocol": "/normalize JSON", "shape": [1, 8, 64], "concurrency": 8}, rps, cpu


def _results(cells: list[tuple[str, float, float]], peak: float, date: str) -> dict[str, Any]:
    pinned = [{**_cell(s, r, c)[0], "rps": r, "cpu_ms_per_request": c} for s, r, c in cells]
    mib = 1 << 20
    memory = [
        {"protocol": "V2 binary", "payload_bytes": 63 * mib, "idle_rss_bytes": 180 * mib, "peak_rss_bytes": peak * mib}
    ]
    meta = {"machine": {"CPU": "AMD EPYC"}, "date": date, "mode": "full"}
    return {"pinned": {"cells": pinned}, "memory": memory, "meta": meta}


def _compare(tmp_path: Path, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    paths = []
    for name, results in (("before", before), ("after", after)):
        (tmp_path / f"{name}.json").write_text(json.dumps(results))
        paths.append(str(tmp_path / f"{name}.json"))
    done = subprocess.run([sys.executable, str(SCRIPT), *paths], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_pinned_cells_and_targets_side_by_side_with_a_dash_where_one_run_lacks_the_cell(tmp_path: Path) -> None:
    before = _results([("normserve", 2100.0, 0.471)], 315.0, "2026-11-26 18:00 UTC")
    after = _results([("normserve", 2759.4, 0.36), ("trivial", 33392.3, 0.0292)], 300.0, "2026-11-26 18:30 UTC")
    lines = _compare(tmp_path, before, after)
    assert (
        lines[0]
        == "before: AMD EPYC, 2026-11-26 18:00 UTC (full run); after: AMD EPYC, 2026-11-26 18:30 UTC (full run)"
    )
    assert lines[2:6] == [
        "| server | case | before | after |",
        "|---|---|---|---|",
        "| normserve | /normalize JSON (1, 8, 64) c=8 | 2,100.0 req/s, 0.471 ms CPU | 2,759.4 req/s, 0.36 ms CPU |",
        "| trivial | /normalize JSON (1, 8, 64) c=8 | - | 33,392.3 req/s, 0.0292 ms CPU |",
    ]
    memory = [line for line in lines if line.startswith("| peak RSS")]
    assert memory == [
        "| peak RSS serving a 63 MiB V2 binary request <= 3x the body | 5.00x the body (2.14x above the idle worker)"
        " (**missed**) | 4.76x the body (1.90x above the idle worker) (**missed**) |"
    ]
