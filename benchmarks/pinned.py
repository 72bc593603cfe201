"""The headline of `normserve bench`: the cost per core, each server pinned to one core and the load to the other.

Unpinned req/s flatters a server that spreads over more cores (MLServer's onnxruntime spins a second thread);
a core is what a user pays for. Each server runs one worker under `taskset -c` on the first core this process
may use, the load generator (this process's thread) on the second (os.sched_setaffinity). The servers stay up
for the whole section and take turns within each round, a different one first each round, so a neighbour's
load on a shared machine falls on all alike; every figure is the median of the rounds. Server CPU per request is
the user + system time of the server's process tree (/proc), read before and after each cell. The servers
waiting their turn cost the shared core little: 1 to 2 ms of CPU per second each, idle, measured.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import servers
from benchmarks.inprocess import sample
from benchmarks.load import Request, check, load
from benchmarks.profiles import pinned_profiles
from benchmarks.serving import TRIVIAL, array_verifier, load_row, make_request, output_of
from benchmarks.targets import PEER_GOALS, SMALL, TRIVIAL_CPU_GOAL

V2_PEERS = ("kserve", "mlserver")  # no /normalize: their V2 JSON infer route takes its place
COLUMN_NAMES = {"trivial": "trivial ASGI app", "naive": "naive FastAPI", "kserve": "KServe", "mlserver": "MLServer"}
Cells = dict[tuple[str, tuple[int, ...], int], list[dict[str, Any]]]  # (server, shape, concurrency): runs


@dataclass(frozen=True)
class PinnedCase:
    shape: tuple[int, ...]
    concurrency: int
    servers: tuple[str, ...]


@dataclass(frozen=True)
class PinnedPlan:
    cases: list[PinnedCase]
    seconds: float  # per cell and round
    rounds: int = 3
    warm_s: float = 1.0  # load before each cell: the server's caches after its neighbours' turns
    profile_s: float = 0.0  # py-spy on normserve per case after the rounds (benchmarks/profiles.py); 0: none


def protocol_of(server: str) -> str:
    return "V2 JSON" if server in V2_PEERS else "/normalize JSON"


def cores() -> tuple[int, int]:
    """(the servers' core, the load generator's core): the first two this process may use."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise RuntimeError(f"the pinned section needs two cores; this process may use {allowed}")
    return allowed[0], allowed[1]


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its live descendants so far (a server that forks counts whole)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # a process that exited while the scan ran
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += servers.cpu_seconds(current)
        except OSError:
            continue
        todo += children.get(current, [])
    return total


def measure(pid: int, port: int, request: Request, concurrency: int, seconds: float, warm_s: float) -> dict[str, Any]:
    """One cell: a warm-up, then the timed load with the server's CPU read before and after (serving.load_row,
    its failed requests counted in `errors`)."""
    if warm_s > 0:
        load(port, request, concurrency, warm_s)
    before = tree_cpu_seconds(pid)
    result = load(port, request, concurrency, seconds)
    return load_row(result, tree_cpu_seconds(pid) - before)


def _checked_request(server: str, port: int, shape: tuple[int, ...]) -> Request:
    """The case's request for this server, its answer checked against the reference once (not the trivial app's)."""
    protocol, x = protocol_of(server), sample(shape)
    request, verify = make_request(protocol, x), array_verifier(protocol, x)
    check(port, request, None if server == TRIVIAL else lambda response: verify(output_of(protocol, response)))
    return request


def pinned_section(plan: PinnedPlan, log: Callable[[str], None]) -> dict[str, Any]:
    """Every case of the plan, the servers up together on one core, the rounds interleaved; medians per cell."""
    server_core, load_core = cores()
    names = list(dict.fromkeys(s for case in plan.cases for s in case.servers))
    affinity = os.sched_getaffinity(0)
    with ExitStack() as stack:
        running = {name: stack.enter_context(servers.serve(name, pin=server_core)) for name in names}
        requests = {(n, c.shape): _checked_request(n, running[n].port, c.shape) for c in plan.cases for n in c.servers}
        os.sched_setaffinity(0, {load_core})  # this thread runs the load loop (one event loop, no threads)
        try:
            runs = _rounds(plan, running, requests, log)
            profiled = _profiles(plan, running, requests, log)  # after every measured cell: none carries py-spy
        finally:
            os.sched_setaffinity(0, affinity)
    figures = {"server_cpu": server_core, "load_cpu": load_core, "rounds": plan.rounds, "seconds": plan.seconds}
    return {**figures, "cells": [_median(key, rows) for key, rows in runs.items()], "profiles": profiled}


def _profiles(
    plan: PinnedPlan,
    running: dict[str, servers.Server],
    requests: dict[tuple[str, tuple[int, ...]], Request],
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """normserve's worker sampled under each case's load, as pinned as its cells were."""
    if plan.profile_s <= 0 or "normserve" not in running:
        return []
    srv = running["normserve"]
    cases = [(c.shape, c.concurrency, srv.pid, srv.port, requests["normserve", c.shape]) for c in plan.cases]
    return pinned_profiles(cases, plan.profile_s, log)


def _rounds(
    plan: PinnedPlan,
    running: dict[str, servers.Server],
    requests: dict[tuple[str, tuple[int, ...]], Request],
    log: Callable[[str], None],
) -> Cells:
    runs: Cells = {}
    for round_ in range(plan.rounds):
        for case in plan.cases:
            first = round_ % len(case.servers)  # a different server first each round
            for name in case.servers[first:] + case.servers[:first]:
                srv, request = running[name], requests[name, case.shape]
                row = measure(srv.pid, srv.port, request, case.concurrency, plan.seconds, plan.warm_s)
                runs.setdefault((name, case.shape, case.concurrency), []).append(row)
                log(
                    f"pinned round {round_ + 1} {name:9} {case.shape!s:15} c={case.concurrency:<3} "
                    f"{row['rps']:9.1f} req/s {row['cpu_ms_per_request']:8.3f} ms CPU/req"
                )
    return runs


def _median(key: tuple[str, tuple[int, ...], int], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The cell's row: the median of each figure over the rounds, the errors and requests summed, the runs kept."""
    server, shape, concurrency = key
    cell: dict[str, Any] = {"server": server, "protocol": protocol_of(server), "shape": shape}
    cell["concurrency"] = concurrency
    for figure in ("rps", "cpu_ms_per_request", "p50_ms", "p99_ms"):
        cell[figure] = statistics.median(r[figure] for r in rows)
    cell["errors"], cell["requests"] = sum(r["errors"] for r in rows), sum(r["requests"] for r in rows)
    cell["runs"] = [[r["rps"], r["cpu_ms_per_request"]] for r in rows]
    return cell


def headline(results: dict[str, Any]) -> list[str]:
    """The headline table: a row per case, a column per server, req/s per core and server CPU per request."""
    pinned = results.get("pinned")
    if not pinned:
        return []
    cells = {(c["server"], tuple(c["shape"]), c["concurrency"]): c for c in pinned["cells"]}
    cases = list(dict.fromkeys((shape, conc) for _, shape, conc in cells))
    names = [n for n in ("normserve", *COLUMN_NAMES) if any(n == s for s, _, _ in cells)]
    versions = results.get("meta", {}).get("versions", {})
    header = ["case", *(_column(n, versions) for n in names), "goal"]
    rows = [[_case(shape, conc), *(_text(cells, n, shape, conc) for n in names), _goal(shape)] for shape, conc in cases]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [
        "## Headline: the cost per core, each server pinned to one core\n",
        f"Each server one worker on CPU {pinned['server_cpu']} (`taskset -c`), the load generator on CPU "
        f"{pinned['load_cpu']}; medians of {pinned['rounds']} interleaved rounds of {pinned['seconds']:g} s per "
        "cell, the servers taking turns within each round. Every cell: requests per second on that one core and "
        "the server's CPU (user + system, /proc) per request; in brackets normserve's req/s and CPU per request as "
        "multiples of the other server's (CPU per request holds steadier than req/s when other work shares the "
        "core). KServe and MLServer answer their V2 JSON route. Section 3 is the unpinned view.\n",
        "\n".join(lines) + "\n",
    ]


def _column(name: str, versions: dict[str, str]) -> str:
    version = versions.get(f"{name} (own venv)", "")  # the peers' versions, from the report's meta
    label = COLUMN_NAMES.get(name, name)
    return f"{label} {version}" if version not in ("", "not run") else label


def _case(shape: tuple[int, ...], conc: int) -> str:
    return f"/normalize JSON ({','.join(map(str, shape))}) c={conc}"


def _text(cells: dict[tuple[str, tuple[int, ...], int], dict[str, Any]], name: str, shape: Any, conc: int) -> str:
    cell, ours = cells.get((name, shape, conc)), cells.get(("normserve", shape, conc))
    if cell is None:
        return "-"
    cpu_ms = cell["cpu_ms_per_request"]
    text = f"{cell['rps']:,.1f} req/s, {f'{cpu_ms:,.0f}' if cpu_ms >= 100 else f'{cpu_ms:.3g}'} ms CPU"
    text += f", {cell['errors']} failed" if cell["errors"] else ""
    if ours is None or name == "normserve":
        return text
    if name == TRIVIAL:
        return f"{text} (ours {ours['cpu_ms_per_request'] / cell['cpu_ms_per_request']:.1f}x its CPU)"
    cpu = ours["cpu_ms_per_request"] / cpu_ms if cpu_ms else float("nan")
    return f"{text} (ours {ours['rps'] / cell['rps']:.1f}x its req/s, {cpu:.2f}x its CPU)" if cell["rps"] else text


def _goal(shape: tuple[int, ...]) -> str:
    goals = PEER_GOALS.get(shape, {})
    text = " / ".join(f"{factor:g}x" for factor in goals.values())
    text = f"req/s >= {text} ({', '.join(COLUMN_NAMES[p] for p in goals)})" if goals else "-"
    return text + (f"; CPU <= {TRIVIAL_CPU_GOAL:g}x the trivial app's" if shape == SMALL else "")
