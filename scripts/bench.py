"""`python scripts/bench.py [--quick]`: the benchmark suite (benchmarks/suite.py), as `normserve bench` runs it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ lives beside app/ in the checkout, not in the installed package

from app.cli.main import needs_extra  # noqa: E402
from benchmarks.options import parse_args  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # --help and bad flags answer before the test extra is needed
    try:
        # The load generator and the report's plot: both checked now rather than after minutes of measuring.
        import httpx  # noqa: F401
        import matplotlib  # noqa: F401

        from benchmarks.suite import run_args
    except ImportError as e:
        return needs_extra("bench", "test", e.name)
    return run_args(args)


if __name__ == "__main__":
    sys.exit(main())
