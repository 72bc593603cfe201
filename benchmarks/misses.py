"""The "Profiles of the misses" section: for each missed target, where its time or memory goes on that run.

`linked` adds the targets table's profile column: a link per missed row to the profile the run measured for it
(the pinned worker's py-spy samples, the conditioned path's stages, the V2 stages of FP32 and FP16, the memory
of the worker), and `section` writes those profiles, each once however many rows link to it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.profiles import STAGES
from benchmarks.sections import table
from benchmarks.serving import HALF
from benchmarks.targets import JSON, LARGE, SMALL, Row

MISSED = "**missed**"
STAGED = "conditioned /normalize path "  # the in-process rows: the shape follows
STATISTICS = "statistics outputs "  # the rows of the statistics' cost: the shape follows
HEADING = "## Profiles of the misses"
Results = dict[str, Any]


def _label(shape: Any) -> str:
    return "(" + ",".join(str(d) for d in shape) + ")"


def _anchor(kind: str, shape: Any = ()) -> str:
    return "-".join(["profile", kind, *(str(d) for d in shape)])


def profile_key(target: str) -> str | None:
    """The anchor of the profile that explains a target row, from the row's target text; None: none is measured."""
    for shape in (SMALL, LARGE):
        if target.startswith(f"{JSON} {shape} c=") and "tracing" not in target:
            return _anchor("pinned", shape)
    for prefix in (STAGED, STATISTICS):  # the statistics' cost is the stages' moments at that shape
        if target.startswith(prefix):
            dims = target[len(prefix) :].split(")")[0].strip("(").split(",")
            return _anchor("stages", [int(d) for d in dims if d.strip()])
    if target.startswith(HALF) or target.startswith(f"V2 binary {LARGE} c=1 over HTTP"):  # FP32's stages too
        return _anchor("v2-stages")
    if target.startswith("peak RSS"):
        return _anchor("memory")
    return None


def _available(results: Results) -> set[str]:
    """The anchors of the profiles this run measured."""
    found = {_anchor("pinned", p["shape"]) for p in results.get("pinned", {}).get("profiles", [])}
    found |= {_anchor("stages", r["shape"]) for r in results.get("profiles", {}).get("stages", [])}
    found |= {_anchor("v2-stages")} if results.get("profiles", {}).get("v2_stages") else set()
    found |= {_anchor("memory")} if results.get("memory") else set()
    return found


def linked(results: Results, rows: list[Row]) -> tuple[list[Row], list[str]]:
    """The rows with a profile column (a link on each missed row whose profile the run has), and the anchors."""
    available, anchors, out = _available(results), [], []
    for row in rows:
        key = profile_key(row[0]) if row[-1] == MISSED else None
        if key in available:
            anchors += [] if key in anchors else [key]
            out.append([*row, f"[profile](#{key})"])
        else:
            out.append([*row, "not profiled" if row[-1] == MISSED else "-"])
    return out, anchors


def section(results: Results, anchors: list[str]) -> list[str]:
    """The profiles the missed rows link to, in the table's order; nothing when no row links to one."""
    if not anchors:
        return []
    parts = [
        f"{HEADING}\n",
        "Measured by this run after the cells they explain (no sampler runs while a figure is measured), on "
        "the same machine: where each missed target's time or memory goes.\n",
    ]
    for anchor in anchors:
        parts += RENDERERS[anchor.split("-")[1]](results, anchor)
    return parts


def _pinned(results: Results, anchor: str) -> list[str]:
    (p,) = [p for p in results["pinned"]["profiles"] if _anchor("pinned", p["shape"]) == anchor]
    title = f'<a id="{anchor}"></a>\n### /normalize JSON {_label(p["shape"])} c={p["concurrency"]}: the pinned worker\n'
    if "error" in p:
        return [title, f"No profile: {p['error']}.\n"]
    layers = [[layer, f"{share:.0%}"] for layer, share in p["layers"].items()]
    top = [[f"`{name}`", f"{share:.1%}"] for name, share in p["top"]]
    return [
        title,
        f"py-spy at 200 Hz for {p['seconds']:g} s on the pinned normserve worker under its cell's load, after the "
        f"measured rounds: {p['samples']} samples of the worker's Python stacks while busy (waits for the network "
        "are not sampled). A sample counts for the layer of its innermost frame in normserve, uvicorn or asyncio; "
        "NumPy and onnxruntime calls count for their caller.\n",
        table(["layer", "share of samples"], layers),
        table(["function (self time)", "share of samples"], top),
    ]


def _stages(results: Results, anchor: str) -> list[str]:
    (r,) = [r for r in results["profiles"]["stages"] if _anchor("stages", r["shape"]) == anchor]
    whole = r["whole_s"]
    rows = [[stage, f"{s * 1e3:.3g}", f"{s / whole:.0%}"] for stage, s in r["stages_s"].items()]
    return [
        f'<a id="{anchor}"></a>\n### The conditioned /normalize path {_label(r["shape"])} in process, stage by stage\n',
        f"The whole call (`model.infer` on the data plane's input, gamma 1, beta 0, eps 1e-5): {whole * 1e3:.3g} "
        "ms, median. Each stage is the function app/core/layernorm.py calls, on the same input, timed in rounds "
        "interleaved with the whole call (medians; a stage the path runs per chunk of rows is timed on the first "
        "chunk, times the number of chunks); the rest is the whole call less the stages (0 when they add up to "
        "more).\n",
        table(["stage", "median ms", "share of the whole call"], rows),
    ]


def _v2_stages(results: Results, anchor: str) -> list[str]:
    fp32, fp16 = ({r["protocol"]: r for r in results["profiles"]["v2_stages"]}[p] for p in ("V2 binary", HALF))
    figures = {stage: (fp32["stage_ms"][stage], fp16["stage_ms"][stage]) for stage in STAGES}
    whole = "server_ms" in fp32  # the worker's CPU around the same requests: runs since it was measured
    if whole:
        outside = [r["server_ms"] - sum(r["stage_ms"].values()) for r in (fp32, fp16)]
        figures |= {"outside the stages (HTTP, transport, middleware)": (outside[0], outside[1])}
        figures |= {"the whole request (the worker's CPU)": (fp32["server_ms"], fp16["server_ms"])}
    rows = [[stage, f"{a:.3g}", f"{b:.3g}", f"{b / a:.2f}" if a else "-"] for stage, (a, b) in figures.items()]
    return [
        f'<a id="{anchor}"></a>\n### V2 binary FP16 and FP32 {_label(fp32["shape"])}: the worker\'s own stages\n',
        f"Triton's statistics extension (/v2/models/layernorm/stats) read before and after {fp32['requests']:.0f} "
        "sequential requests of each, ms per request"
        + (", and the worker's CPU (user + system) around the same requests" if whole else "")
        + ". FP16 moves half the bytes of the same elements: a stage near 0.5x scales with bytes, one near 1x or "
        "above with elements (and FP16's faithful rounding).\n",
        table(["stage", "FP32 ms", "FP16 ms", "FP16 / FP32"], rows),
        *([_parity(fp32, fp16)] if whole else []),
    ]


def _parity(fp32: dict[str, Any], fp16: dict[str, Any]) -> str:
    """What the per-byte row asks of FP16's compute, from the same requests: the whole FP16 request at most half
    the FP32 one, and what is left of it with compute_infer taken away."""
    half, rest = fp32["server_ms"] / 2, fp16["server_ms"] - fp16["stage_ms"]["compute_infer"]
    verdict = (
        "more than that already: no FP16 compute, however fast, meets the row"
        if rest > half
        else f"within it: a compute_infer of at most {half - rest:.3g} ms would meet the row"
    )
    return (
        f"Moving FP16's bytes as fast as FP32's per byte means an FP16 request costs at most half an FP32 one: "
        f"{half:.3g} ms of the worker's CPU. The FP16 request without its compute_infer costs {rest:.3g} ms, "
        f"{verdict}.\n"
    )


def _memory(results: Results, anchor: str) -> list[str]:
    mib = 2**20
    rows = [
        [
            r["protocol"],
            f"{r['payload_bytes'] / mib:.1f}",
            f"{r['idle_rss_bytes'] / mib:.0f}",
            f"{(r['peak_rss_bytes'] - r['idle_rss_bytes']) / mib:.0f}",
            f"{(r['peak_rss_bytes'] - r['idle_rss_bytes']) / r['payload_bytes']:.2f}x",
        ]
        for r in results["memory"]
    ]
    parts = [
        f'<a id="{anchor}"></a>\n### Peak RSS: the idle worker, the body and the rest\n',
        "Section 5's figures apart: the peak is the idle worker plus what the request adds.\n",
        table(["request", "body MiB", "idle worker MiB", "peak above idle MiB", "above idle / body"], rows),
    ]
    return parts + _idle(results)


def _idle(results: Results) -> list[str]:
    idle = results.get("profiles", {}).get("idle_rss")
    if not idle:
        return []
    if "error" in idle:
        return [f"What the idle RSS is made of was not measured: {idle['error']}.\n"]
    worker = min(r["idle_rss_bytes"] for r in results["memory"])
    steps = [*idle.items(), ("the idle worker (uvicorn, warm-up, a first request)", worker)]
    rows, last = [], 0
    for name, rss in steps:
        rows.append([name, f"{rss / 2**20:.0f}", f"{(rss - last) / 2**20:+.0f}"])
        last = rss
    return [
        "What the idle RSS is made of: a fresh Python reading its own RSS after each step, then section 5's "
        "idle worker.\n",
        table(["after", "RSS MiB", "step MiB"], rows),
    ]


RENDERERS: dict[str, Callable[[Results, str], list[str]]] = {
    "pinned": _pinned,
    "stages": _stages,
    "v2": _v2_stages,
    "memory": _memory,
}
