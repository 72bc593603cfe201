"""The issue's targets, each computed from one run's results: a row of (target, measured, verdict)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.inprocess import TORCH

SMALL, LARGE = (1, 8, 64), (8, 128, 768)
Row = list[str]


def _cell(
    results: dict[str, Any], server: str, protocol: str, shape: tuple[int, ...], conc: int
) -> dict[str, Any] | None:
    rows: list[dict[str, Any]] = results.get("http", [])
    for r in rows:
        if (r["server"], r["protocol"], tuple(r["shape"]), r["concurrency"]) == (server, protocol, shape, conc):
            return r
    return None


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _peers(results: dict[str, Any], shape: tuple[int, ...], conc: int) -> list[tuple[str, dict[str, Any]]]:
    cells = [("naive FastAPI", _cell(results, "naive", "/normalize JSON", shape, conc))]
    cells.append(("KServe V2 JSON", _cell(results, "kserve", "V2 JSON", shape, conc)))
    return [(name, c) for name, c in cells if c is not None]


def _vs_peers(results: dict[str, Any], shape: tuple[int, ...], factor: float, with_p99: bool) -> list[Row]:
    conc = 8 if _peers(results, shape, 8) else 1  # a quick run leaves out the peers' slow cells at c=8
    ours = _cell(results, "normserve", "/normalize JSON", shape, conc)
    peers = _peers(results, shape, conc)
    if ours is None or not peers:
        return [[f"/normalize JSON {shape} c=8: >= {factor:g}x the peers' req/s", "not measured in this run", "-"]]
    rows = []
    for name, peer in peers:
        ratio = ours["rps"] / peer["rps"] if peer["rps"] else float("inf")
        rows.append(
            [
                f"/normalize JSON {shape} c={conc}: req/s >= {factor:g}x {name}",
                f"{ours['rps']:.1f} vs {peer['rps']:.1f} req/s = {ratio:.1f}x",
                _verdict(ratio >= factor),
            ]
        )
        if with_p99:
            p = ours["p99_ms"] / peer["p99_ms"]
            rows.append(
                [
                    f"/normalize JSON {shape} c={conc}: p99 <= 1/4 of {name}'s",
                    f"{ours['p99_ms']:.3g} vs {peer['p99_ms']:.3g} ms = {p:.2f}x",
                    _verdict(p <= 0.25),
                ]
            )
    return rows


def _json_floor(results: dict[str, Any]) -> list[Row]:
    ours, floor = _cell(results, "normserve", "/normalize JSON", LARGE, 1), results.get("json_floor")
    if ours is None or floor is None:
        return []
    ratio = ours["p50_ms"] / (floor["sum"] * 1e3)
    return [
        [
            f"/normalize JSON {LARGE}: time per request (p50, c=1) <= 1.3x the in-process sum",
            f"{ours['p50_ms']:.1f} ms vs {floor['sum'] * 1e3:.1f} ms = {ratio:.2f}x",
            _verdict(ratio <= 1.3),
        ]
    ]


def _binary(results: dict[str, Any]) -> list[Row]:
    rows = []
    c = 8 if _cell(results, "kserve", "V2 JSON", LARGE, 8) else 1  # a quick run leaves out KServe's slow c=8
    ours = _cell(results, "normserve", "V2 binary", LARGE, c)
    kjson, kbin = _cell(results, "kserve", "V2 JSON", LARGE, c), _cell(results, "kserve", "V2 binary", LARGE, c)
    if ours and kjson:
        r = ours["rps"] / kjson["rps"]
        rows.append([f"V2 binary {LARGE} c={c}: >= 100x KServe V2 JSON", f"{r:.0f}x", _verdict(r >= 100)])
    if ours and kbin:
        r = ours["rps"] / kbin["rps"]
        rows.append([f"V2 binary {LARGE} c={c}: faster than KServe's binary", f"{r:.2f}x its req/s", _verdict(r > 1)])
    one, floor = _cell(results, "normserve", "V2 binary", LARGE, 1), results.get("binary_floor")
    if one and floor:
        bound = 3 * floor["compute"] + floor["loopback transfer"]
        rows.append(
            [
                f"V2 binary {LARGE}: p50 at c=1 <= 3x (onnxruntime + 2 copies) + loopback",
                f"{one['p50_ms']:.2f} ms vs bound {bound * 1e3:.2f} ms ({one['p50_ms'] / (bound * 1e3):.2f}x)",
                _verdict(one["p50_ms"] <= bound * 1e3),
            ]
        )
    return rows


def _in_process(results: dict[str, Any]) -> list[Row]:
    rows = []
    for r in results.get("stats_cost", []):
        over = r["all_s"] / r["output_s"] - 1
        rows.append(
            [f"statistics outputs {tuple(r['shape'])}: <= 10% over output only", f"{over:+.1%}", _verdict(over <= 0.10)]
        )
    by = {(tuple(r["shape"]), r["method"]): r["median_s"] for r in results.get("floor", [])}
    for shape in sorted({s for s, _ in by}):
        numpy_s = by.get((shape, "NumPy reference (float64)"))
        for method in ("onnxruntime, plain session call", "onnxruntime, our conditioned path"):
            ort_s = by.get((shape, method))
            if numpy_s and ort_s:
                torch_s = {m: s for (sh, m), s in by.items() if sh == shape and m.startswith(TORCH)}
                beside = "".join(f"; {m.removeprefix(TORCH + ', ')} torch {s * 1e3:.3g} ms" for m, s in torch_s.items())
                rows.append(
                    [
                        f"{method} {shape}: faster than NumPy",
                        f"{ort_s * 1e3:.3g} vs {numpy_s * 1e3:.3g} ms{beside}",
                        _verdict(ort_s < numpy_s),
                    ]
                )
    return rows


def _memory(results: dict[str, Any]) -> list[Row]:
    rows = []
    for r in results.get("memory", []):
        ratio = r["peak_rss_bytes"] / r["payload_bytes"]
        growth = (r["peak_rss_bytes"] - r["idle_rss_bytes"]) / r["payload_bytes"]
        rows.append(
            [
                f"peak RSS serving a {r['payload_bytes'] / 2**20:.0f} MiB {r['protocol']} request <= 4x the body",
                f"{ratio:.2f}x the body ({growth:.2f}x above the idle worker)",
                _verdict(ratio <= 4),
            ]
        )
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
                f"up to seq {max(cheaper)}" if cheaper else "at no length",
            ]
        )
    return rows


SECTIONS: list[Callable[[dict[str, Any]], list[Row]]] = [_in_process, _json_floor, _binary, _memory, _batching]


def evaluate(results: dict[str, Any]) -> list[Row]:
    rows = _vs_peers(results, SMALL, 5, with_p99=True) + _vs_peers(results, LARGE, 12, with_p99=False)
    for section in SECTIONS:
        rows += section(results)
    return rows
