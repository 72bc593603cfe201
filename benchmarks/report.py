"""docs/benchmarks.md (a table per section, the targets, the machine) and docs/benchmarks.png."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from benchmarks import misses
from benchmarks.pinned import headline
from benchmarks.sections import sections, table
from benchmarks.targets import COLUMNS, evaluate


def write_markdown(results: dict[str, Any], path: Path, png_name: str) -> None:
    meta = results["meta"]
    parts = [
        "# Benchmarks\n",
        "Reproduce with `normserve bench` (about 25 minutes; `--quick` under 5). It starts and stops every "
        "server itself on 127.0.0.1, one worker each, and creates the KServe and MLServer peers' venvs under "
        "`.bench/` (a quick run uses them only if present, or with `--with-kserve` / `--with-mlserver`). "
        "Raw figures: [benchmarks.json](benchmarks.json).\n",
        f"Written by `{meta['command']}` on {meta['date']} ({meta['mode']} run, {meta['seconds']:.0f} s in all). "
        "Every figure below comes from that one run on one machine, so the ratios compare like with like.\n",
    ]
    if meta.get("note"):
        parts.append(f"**Note:** {meta['note']}\n")
    machine = [[k, v] for k, v in meta["machine"].items()] + [[k, v] for k, v in meta["versions"].items()]
    parts += ["## Machine and versions\n", table(["", ""], machine)]
    parts += headline(results)  # the pinned comparison: what a user pays per core
    rows, profiled = misses.linked(results, evaluate(results))
    parts += ["## Targets\n", table([*COLUMNS, "profile"], rows)]
    parts += misses.section(results, profiled)  # where each missed target's time or memory goes, this run
    parts += sections(results)
    parts.append(f"\n![latency against payload size]({png_name})\n")
    notes = Path(__file__).with_name("notes.md")
    if notes.is_file():  # the hand-written reading of the profiles, the same in every run's report
        parts.append(notes.read_text())
    path.write_text("\n".join(parts))


def write_plot(results: dict[str, Any], path: Path) -> None:
    """Median latency against payload bytes: in process (left) and over HTTP at concurrency 1 (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    series: dict[str, list[tuple[int, float]]] = {}
    for r in results.get("floor", []):
        series.setdefault(r["method"], []).append((r["bytes"], r["median_s"] * 1e3))
    _lines(left, series, "in process: median latency")
    series = {}
    for r in results.get("http", []):
        if r["concurrency"] == min(x["concurrency"] for x in results["http"]):
            nbytes = 4 * math.prod(r["shape"])
            series.setdefault(f"{r['server']}: {r['protocol']}", []).append((nbytes, r["p50_ms"]))
    _lines(right, series, "over HTTP, concurrency 1: p50 latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _lines(ax: Any, series: dict[str, list[tuple[int, float]]], title: str) -> None:
    for label, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("payload, bytes of float32")
    ax.set_ylabel("ms")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if series:
        ax.legend(fontsize=7)
