"""Two checkouts of normserve side by side, each server pinned to one core and the load to the other.

The cases are the benchmark's own (benchmarks/serving.py): small /normalize JSON (1,8,64) at concurrency 8
and V2 binary (8,128,768) at concurrency 1, one uvicorn worker each. Rounds interleave the checkouts, so a
neighbour's load on this shared machine falls on both alike; the figures are medians over the rounds.
Server CPU per request is read from /proc/PID/stat (user + system), the cost a user pays per core. A cell
is the benchmark's own (benchmarks/pinned.py's measure: a warm-up, then the load with the CPU read around it).

    python scripts/pinned_ab.py before=/path/to/old/checkout after=.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

# Run as a file (python scripts/pinned_ab.py) the repository root is not on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import servers
from benchmarks.inprocess import sample
from benchmarks.load import Request, check
from benchmarks.pinned import measure as measure_cell
from benchmarks.serving import make_request

CASES = {  # name: (protocol, shape, concurrency)
    "/normalize JSON (1,8,64) c=8": ("/normalize JSON", (1, 8, 64), 8),
    "V2 binary (8,128,768) c=1": ("V2 binary", (8, 128, 768), 1),
}
SERVER_CPU, LOAD_CPU = 0, 1


def measure(checkout: Path, request: Request, concurrency: int, seconds: float) -> tuple[float, float]:
    """(requests per second, server CPU ms per request) of one pinned server on one case."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "NORMSERVE_MODEL_DIR": str(checkout / "models")}
    env |= {"NORMSERVE_LOG_LEVEL": "warning", "NORMSERVE_GRPC_PORT": "0"}  # as the benchmark runs it
    command = ["taskset", "-c", str(SERVER_CPU), *servers.normserve_command()]
    servers.CACHE.mkdir(exist_ok=True)  # a fresh checkout has no .bench yet
    log = servers.CACHE / "pinned_ab.log"
    with servers.server_process(command, cwd=checkout, env=env, output=log) as server:
        check(server.port, request)
        row = measure_cell(server.pid, server.port, request, concurrency, seconds, warm_s=1.0)
    if row["errors"]:
        raise RuntimeError(f"{checkout}: {row['errors']} failed requests")
    return row["rps"], row["cpu_ms_per_request"]


def run(
    checkouts: dict[str, Path], rounds: int, seconds: float, cases: Sequence[str] = tuple(CASES)
) -> dict[tuple[str, str], list[tuple[float, float]]]:
    os.sched_setaffinity(0, {LOAD_CPU})
    figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for round_ in range(rounds):
        for case in cases:
            protocol, shape, concurrency = CASES[case]
            request = make_request(protocol, sample(shape))
            for name, checkout in checkouts.items():
                rps, cpu_ms = measure(checkout, request, concurrency, seconds)
                figures.setdefault((case, name), []).append((rps, cpu_ms))
                print(f"round {round_ + 1} {case} {name}: {rps:.1f} req/s, {cpu_ms:.3f} ms CPU/request", flush=True)
    return figures


def table(
    figures: dict[tuple[str, str], list[tuple[float, float]]], names: Sequence[str], cases: Sequence[str] = tuple(CASES)
) -> str:
    head = "| case | " + " | ".join(f"{n} req/s | {n} CPU ms/req" for n in names) + " |"
    lines = [head, "|---" * (1 + 2 * len(names)) + "|"]
    for case in cases:
        cells = []
        for name in names:
            runs = figures[case, name]
            cells += [f"{statistics.median(r for r, _ in runs):.1f}", f"{statistics.median(c for _, c in runs):.3f}"]
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+", help="NAME=PATH of a normserve checkout (its app/ and models/)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--case", choices=["all", *CASES], default="all", help="one case alone (default: all)")
    args = parser.parse_args(argv)
    checkouts = {n: Path(p).resolve() for n, _, p in (c.partition("=") for c in args.checkouts)}
    cases = list(CASES) if args.case == "all" else [args.case]
    figures = run(checkouts, args.rounds, args.seconds, cases)
    rounds = f"medians of {args.rounds} interleaved rounds of {args.seconds:g} s"
    print(f"\n{rounds}, server on CPU {SERVER_CPU}, load on CPU {LOAD_CPU}")
    print(table(figures, list(checkouts), cases))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
