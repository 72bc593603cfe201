"""The issue's targets, each computed from one run's results: (target, measured, multiple of its floor, verdict).

The floors are measured in the same run (benchmarks/floors.py): the trivial ASGI app for the small JSON
request's server CPU, the in-process sum for the large JSON request, the raw loopback socket and the
minimal grpcio server for V2 binary, torch for the in-process rows, the body for peak memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from benchmarks.floors import GRPC_FLOOR
from benchmarks.inprocess import TORCH
from benchmarks.serving import HALF, TRACED, TRIVIAL

SMALL: tuple[int, ...] = (1, 8, 64)
LARGE: tuple[int, ...] = (8, 128, 768)
JSON = "/normalize JSON"
NOT_RUN = "not measured in this run"
PEER_NAMES = {"mlserver": "MLServer V2 JSON", "naive": "naive FastAPI", "kserve": "KServe V2 JSON"}
# Issue 25's goals, per core (the pinned headline): normserve's req/s as a multiple of each peer's, per shape.
PEER_GOALS = {
    SMALL: {"naive": 10.0, "kserve": 10.0, "mlserver": 6.0},
    LARGE: {"naive": 30.0, "kserve": 30.0, "mlserver": 4.0},
}
PEER_CONCURRENCY = {SMALL: 8, LARGE: 1}
TRIVIAL_CPU_GOAL = 6.0  # server CPU per small request, a multiple of the trivial ASGI app's
MEMORY_GOALS = {"/normalize JSON": 4.0, "V2 binary": 3.0, "gRPC": 3.0}  # peak RSS, a multiple of the body
Row = list[str]  # target, measured, its multiple of its floor, verdict
COLUMNS = ["target", "measured", "multiple of its floor", "verdict"]


def _cell(
    results: dict[str, Any],
    server: str,
    protocol: str,
    shape: tuple[int, ...],
    conc: int,
    rows: list[dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """The cell of rows (section 3's unless given) for that server, protocol, shape and concurrency."""
    for r in results.get("http", []) if rows is None else rows:
        if (r["server"], r["protocol"], tuple(r["shape"]), r["concurrency"]) == (server, protocol, shape, conc):
            return r
    return None


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _row(target: str, measured: str, ratio: float, ok: bool) -> Row:
    return [target, measured, f"{ratio:.2f}x", _verdict(ok)]


def _cpu(cell: dict[str, Any]) -> float:
    return float(cell["cpu_ms_per_request"])


def _cells(results: dict[str, Any], shape: tuple[int, ...], conc: int) -> tuple[list[dict[str, Any]], str]:
    """The pinned headline's cells when it measured normserve at this case, else section 3's (unpinned)."""
    pinned: list[dict[str, Any]] = results.get("pinned", {}).get("cells", [])
    if any((r["server"], tuple(r["shape"]), r["concurrency"]) == ("normserve", shape, conc) for r in pinned):
        return pinned, "pinned"
    return results.get("http", []), "unpinned"


def _http_floor(results: dict[str, Any]) -> list[Row]:
    rows, how = _cells(results, SMALL, 8)
    target = f"{JSON} {SMALL} c=8 ({how}): server CPU per request <= {TRIVIAL_CPU_GOAL:g}x the trivial ASGI app's"
    ours, floor = _cell(results, "normserve", JSON, SMALL, 8, rows), _cell(results, TRIVIAL, JSON, SMALL, 8, rows)
    if ours is None or floor is None:
        return [[target, NOT_RUN, "-", "-"]]
    ratio = _cpu(ours) / _cpu(floor)
    return [_row(target, f"{_cpu(ours):.3g} vs {_cpu(floor):.3g} ms", ratio, ratio <= TRIVIAL_CPU_GOAL)]


def _our_floor(results: dict[str, Any], ours: dict[str, Any], shape: tuple[int, ...], conc: int) -> str:
    """Our JSON cell as a multiple of its floor: the trivial app's CPU (small), the in-process sum's time (large)."""
    trivial, sums = (
        _cell(results, TRIVIAL, JSON, shape, conc, _cells(results, shape, conc)[0]),
        results.get("json_floor"),
    )
    if shape == SMALL and trivial:
        return f"ours: CPU {_cpu(ours) / _cpu(trivial):.1f}x the trivial app's"
    if shape != SMALL and sums:
        return f"ours: p50 {ours['p50_ms'] / (sums['sum'] * 1e3):.2f}x the in-process sum"
    return "-"


def _vs_peers(results: dict[str, Any], shape: tuple[int, ...]) -> list[Row]:
    """req/s of /normalize JSON against each peer's JSON route, per core when the pinned headline ran."""
    conc = PEER_CONCURRENCY[shape]
    cells, how = _cells(results, shape, conc)
    ours = _cell(results, "normserve", JSON, shape, conc, cells)
    rows = []
    for peer, factor in PEER_GOALS[shape].items():
        target = f"{JSON} {shape} c={conc} ({how}): req/s >= {factor:g}x {PEER_NAMES[peer]}"
        theirs = _cell(results, peer, JSON if peer == "naive" else "V2 JSON", shape, conc, cells)
        if ours is None or theirs is None:
            rows.append([target, NOT_RUN, "-", "-"])
            continue
        ratio = ours["rps"] / theirs["rps"] if theirs["rps"] else float("inf")
        measured = f"{ours['rps']:.1f} vs {theirs['rps']:.1f} req/s = {ratio:.1f}x"
        rows.append([target, measured, _our_floor(results, ours, shape, conc), _verdict(ratio >= factor)])
    return rows


def _tracing(results: dict[str, Any]) -> list[Row]:
    off, on = _cell(results, "normserve", JSON, SMALL, 8), _cell(results, TRACED, JSON, SMALL, 8)
    if off is None or on is None:
        return []
    trivial = _cell(results, TRIVIAL, JSON, SMALL, 8)
    floor = f"off {_cpu(off) / _cpu(trivial):.1f}x, on {_cpu(on) / _cpu(trivial):.1f}x" if trivial else "-"
    return [
        [
            f"{JSON} {SMALL} c=8: server CPU per request, tracing off (the default) and on (OTLP to loopback)",
            f"off {_cpu(off):.3g} ms, on {_cpu(on):.3g} ms ({_cpu(on) / _cpu(off) - 1:+.0%} on)",
            floor,
            "off is the plain server's own config",
        ]
    ]


def _in_process(results: dict[str, Any]) -> list[Row]:
    by = {(tuple(r["shape"]), r["method"]): r["median_s"] for r in results.get("floor", [])}
    rows = []
    for shape in sorted({s for s, _ in by}):
        mine = by.get((shape, "onnxruntime, our conditioned path"))
        if shape == SMALL:  # where onnxruntime's call overhead dominates, the plain call is the floor
            base, name = by.get((shape, "onnxruntime, plain session call")), "a plain onnxruntime session call"
        else:
            base, name = by.get((shape, f"{TORCH}, 1 thread")), f"{TORCH} at 1 thread (as our session)"
        if mine and base:
            target = f"conditioned /normalize path {shape} in process: <= 2x {name}"
            rows.append(_row(target, f"{mine * 1e3:.3g} vs {base * 1e3:.3g} ms", mine / base, mine / base <= 2))
    for r in results.get("stats_cost", []):
        over = r["all_s"] / r["output_s"] - 1
        target = f"statistics outputs {tuple(r['shape'])}: <= 10% over output only"
        rows.append([target, f"{over:+.1%}", "-", _verdict(over <= 0.10)])
    return rows


def _encoder(results: dict[str, Any]) -> list[Row]:
    rows = []
    for r in results.get("encoder_torch", []):
        ratio = r["ours_s"] / r["torch_s"]
        target = f"/encode {tuple(r['shape'])} in process: <= 1.5x torch's Encoder (same weights, 1 thread)"
        rows.append(_row(target, f"{r['ours_s'] * 1e3:.3g} vs {r['torch_s'] * 1e3:.3g} ms", ratio, ratio <= 1.5))
    return rows


def _binary(results: dict[str, Any]) -> list[Row]:
    rows = []
    one, floor = _cell(results, "normserve", "V2 binary", LARGE, 1), results.get("binary_floor")
    if one and floor:
        ratio = one["p50_ms"] / floor["p50_ms"]
        measured = f"{one['p50_ms']:.3g} vs {floor['p50_ms']:.3g} ms (raw socket, torch, a copy in and out)"
        rows.append(_row(f"V2 binary {LARGE} c=1 over HTTP: p50 <= 3x its floor", measured, ratio, ratio <= 3))
    grpc, gfloor = _cell(results, "normserve", "gRPC", LARGE, 1), _cell(results, GRPC_FLOOR, "gRPC", LARGE, 1)
    if grpc and gfloor:
        ratio = grpc["p50_ms"] / gfloor["p50_ms"]
        measured = f"{grpc['p50_ms']:.3g} vs {gfloor['p50_ms']:.3g} ms (a minimal grpcio server)"
        rows.append(_row(f"V2 binary {LARGE} c=1 over gRPC: p50 <= 2x its floor", measured, ratio, ratio <= 2))
    c = 8 if _cell(results, "kserve", "V2 JSON", LARGE, 8) else 1  # a quick run leaves out KServe's slow c=8
    ours = _cell(results, "normserve", "V2 binary", LARGE, c)
    kjson, kbin = _cell(results, "kserve", "V2 JSON", LARGE, c), _cell(results, "kserve", "V2 binary", LARGE, c)
    if ours and kjson:
        r = ours["rps"] / kjson["rps"]
        rows.append([f"V2 binary {LARGE} c={c}: >= 100x KServe V2 JSON", f"{r:.0f}x", "-", _verdict(r >= 100)])
    if ours and kbin:
        r = ours["rps"] / kbin["rps"]
        rows.append(
            [f"V2 binary {LARGE} c={c}: faster than KServe's binary", f"{r:.2f}x its req/s", "-", _verdict(r > 1)]
        )
    return rows


def _memory(results: dict[str, Any]) -> list[Row]:
    rows = []
    for r in results.get("memory", []):
        ratio, goal = r["peak_rss_bytes"] / r["payload_bytes"], MEMORY_GOALS[r["protocol"]]
        growth = (r["peak_rss_bytes"] - r["idle_rss_bytes"]) / r["payload_bytes"]
        target = (
            f"peak RSS serving a {r['payload_bytes'] / 2**20:.0f} MiB {r['protocol']} request <= {goal:g}x the body"
        )
        measured = f"{ratio:.2f}x the body ({growth:.2f}x above the idle worker)"
        rows.append([target, measured, f"{ratio:.2f}x", _verdict(ratio <= goal)])
    return rows


def _batching(results: dict[str, Any]) -> list[Row]:
    cells = {(tuple(r["shape"]), r["batching"], r["concurrency"]): r for r in results.get("batching", [])}
    effects = {}  # shape -> (req/s gain at the high concurrency, p99 ratio at the low, requests per run, labels)
    for shape in sorted({k[0] for k in cells}):
        lo, hi = min(k[2] for k in cells if k[0] == shape), max(k[2] for k in cells if k[0] == shape)
        if not all((shape, b, c) in cells for b in ("off", "on") for c in (lo, hi)):
            continue
        gain = cells[(shape, "on", hi)]["rps"] / cells[(shape, "off", hi)]["rps"]
        p99 = cells[(shape, "on", lo)]["p99_ms"] / cells[(shape, "off", lo)]["p99_ms"]
        effects[shape] = (gain, p99, cells[(shape, "on", hi)].get("requests_per_run", float("nan")), lo, hi)
    # A shape whose requests fill a batch alone never merges: its on/off gain is the machine's noise.
    controls = [g for g, _, merged, _, _ in effects.values() if not merged > 1.05]
    noise = max([1.05, *controls])
    rows = []
    for shape, (gain, p99, merged, lo, hi) in effects.items():
        helps = merged > 1.2 and gain > noise and p99 <= 1.05
        rows.append(
            [
                f"/encode {shape}: batching raises req/s at c={hi} without raising p99 at c={lo}",
                f"req/s x{gain:.2f} at c={hi} ({merged:.2f} requests per run; noise x{noise:.2f}); "
                f"p99 x{p99:.2f} at c={lo}",
                "-",
                "worth turning on" if helps else "not worth turning on",
            ]
        )
    merged_runs = results.get("merged_runs", [])
    if merged_runs:
        cheaper = [r["seq"] for r in merged_runs if r["ratio"] < 0.95]
        ratios = ", ".join(f"{r['ratio']:.2f} at {r['seq']}" for r in merged_runs)
        rows.append(
            [
                "in process: a merged encoder run is cheaper per sequence",
                f"merged / separate CPU: {ratios}",
                "-",
                f"up to seq {max(cheaper)}" if cheaper else "at no length",
            ]
        )
    return rows


def tensor_mb(cell: dict[str, Any]) -> float:
    """MB of tensor data a V2 binary request moves: its input in and its output back, in its datatype."""
    return 2 * (2 if cell["protocol"] == HALF else 4) * int(math.prod(cell["shape"])) / 1e6


def half_pairs(results: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(FP32 cell, FP16 cell) of normserve's V2 binary rows at each shape and concurrency both ran."""
    pairs = []
    for cell in results.get("http", []):
        if (cell["server"], cell["protocol"]) == ("normserve", HALF):
            fp32 = _cell(results, "normserve", "V2 binary", tuple(cell["shape"]), cell["concurrency"])
            if fp32:
                pairs.append((fp32, cell))
    return pairs


def _half(results: dict[str, Any]) -> list[Row]:
    """Issue 26: the FP16 row moves its tensor bytes no slower than the FP32 row moves its own."""
    rows = []
    for fp32, fp16 in half_pairs(results):
        per32, per16 = fp32["rps"] * tensor_mb(fp32), fp16["rps"] * tensor_mb(fp16)
        target = f"{HALF} {tuple(fp16['shape'])} c={fp16['concurrency']}: no slower than the FP32 row per byte moved"
        measured = f"{per16:.0f} vs {per32:.0f} MB/s of tensors in + out ({fp16['rps']:.1f} vs {fp32['rps']:.1f} req/s)"
        rows.append([target, measured, f"{per16 / per32:.2f}x the FP32 row", _verdict(per16 >= per32)])
    return rows


SECTIONS: list[Callable[[dict[str, Any]], list[Row]]] = [
    _tracing,
    _in_process,
    _encoder,
    _binary,
    _half,
    _memory,
    _batching,
]


def evaluate(results: dict[str, Any]) -> list[Row]:
    """Issue 13's targets in its order (issue 25's goals), then the other issues' rows: one list of COLUMNS per row."""
    rows = _http_floor(results)
    rows += _vs_peers(results, SMALL) + _vs_peers(results, LARGE)
    for section in SECTIONS:
        rows += section(results)
    return rows
