"""`normserve bench`'s options, with the standard library only: `--help` and bad flags answer without the test extra."""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("pinned", "floor", "codecs", "http", "batching", "monitor", "memory", "embeddings")
DESCRIPTION = "Run every benchmark section in one process, then write docs/benchmarks.md and docs/benchmarks.png."


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, with --sections as a tuple of known section names."""
    p = argparse.ArgumentParser(prog="normserve bench", description=DESCRIPTION)
    p.add_argument("--quick", action="store_true", help="~1.5 s per HTTP cell and fewer cells: under 5 minutes")
    p.add_argument("--with-kserve", action="store_true", help="quick run: create the KServe venv if absent and run it")
    p.add_argument("--no-kserve", action="store_true", help="leave the KServe peer out")
    p.add_argument("--with-mlserver", action="store_true", help="quick run: create the MLServer venv if absent, run it")
    p.add_argument("--no-mlserver", action="store_true", help="leave the MLServer peer out")
    p.add_argument("--out-dir", type=Path, default=ROOT / "docs", help="where benchmarks.md and .png go")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--note", default="", help="a sentence for the report, e.g. that the machine was shared")
    p.add_argument("--render", type=Path, help="only rewrite the report from a saved benchmarks.json")
    args = p.parse_args(argv)
    args.sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; expected some of {','.join(SECTIONS)}")
    return args
