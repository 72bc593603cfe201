"""`python scripts/bench.py [--quick]`: the benchmark suite (benchmarks/suite.py), as `normserve bench` runs it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ lives beside app/ in the checkout, not in the installed package

from benchmarks.suite import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
