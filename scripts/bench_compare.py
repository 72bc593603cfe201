"""Two `normserve bench` runs side by side: each pinned cell and each target row, before and after.

    python scripts/bench_compare.py BEFORE/benchmarks.json AFTER/benchmarks.json > comparison.md

The runs should come from one sitting on one machine (the report's `meta` says which CPU each ran on); a row
only one run has shows `-` on the other side (a target added since, or a cell the older server cannot serve).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file, the checkout is not on sys.path

from benchmarks.targets import evaluate

VERDICTS = ("met", "**missed**")


def pinned_rows(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """| server | case | before | after | for every pinned cell of either run: req/s and server CPU per request."""
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for side, results in (("before", before), ("after", after)):
        for c in results.get("pinned", {}).get("cells", []):
            case = f"{c['protocol']} {tuple(c['shape'])} c={c['concurrency']}"
            text = f"{c['rps']:,.1f} req/s, {c['cpu_ms_per_request']:.3g} ms CPU"
            cells.setdefault((c["server"], case), {})[side] = text
    lines = ["| server | case | before | after |", "|---|---|---|---|"]
    for (server, case), sides in cells.items():
        lines.append(f"| {server} | {case} | {sides.get('before', '-')} | {sides.get('after', '-')} |")
    return lines


def _verdict(row: list[str]) -> str:
    return next((cell for cell in row if cell in VERDICTS), row[-1])


def target_rows(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """| target | before | after | for every target row of either run, the measured figure and its verdict."""
    rows: dict[str, dict[str, str]] = {}
    for side, results in (("before", before), ("after", after)):
        for row in evaluate(results):
            rows.setdefault(row[0], {})[side] = f"{row[1]} ({_verdict(row)})"
    lines = ["| target | before | after |", "|---|---|---|"]
    lines += [f"| {t} | {s.get('before', '-')} | {s.get('after', '-')} |" for t, s in rows.items()]
    return lines


def machine(results: dict[str, Any]) -> str:
    meta = results.get("meta", {})
    return f"{meta.get('machine', {}).get('CPU', '?')}, {meta.get('date', '?')} ({meta.get('mode', '?')} run)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    args = p.parse_args(argv)
    before, after = (json.loads(path.read_text()) for path in (args.before, args.after))
    out = [f"before: {machine(before)}; after: {machine(after)}", "", *pinned_rows(before, after), ""]
    print("\n".join(out + target_rows(before, after)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
