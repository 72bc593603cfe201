"""Fidelity of float32, FP16 and BF16 LayerNorm against float64 math: torch, plain onnxruntime and normserve
(docs/fidelity.md)."""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

# Run as a file (python scripts/fidelity.py) the repository root is not on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling fidelity_half, when loaded from elsewhere

import fidelity_half

from app.core import reference
from app.core.conditioning import REFINE_TOL, condition_rows, refine_rows
from app.core.dataplane import NormalizeInput
from app.core.layernorm import FLOAT32_ULP, NORMALIZE_ATOL
from app.core.model import Model
from app.core.runtime import Runtime
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[1]

OFFSETS = (0.0, 1e2, 1e4, 1e6, 1e8)  # a row's center in units of its std
MAGNITUDES = (1e-30, 1e-20, 1e-10, 1e-2, 1.0, 1e4, 1e10, 1e19, 1e30, 1e37)  # a row's center (its std at offset 0)
EPS = 1e-5
IMPLS = ("torch", "onnxruntime", "normserve")
CASES = [(mode, k, affine) for mode in ("var", "std") for k in (1, 2) for affine in (False, True)]


def grid_point(offset: float, magnitude: float, shape: Sequence[int], seed: int = 0) -> np.ndarray:
    """float32 rows magnitude * z at offset 0, else magnitude * (1 + z / offset): std = magnitude / offset."""
    z = np.random.default_rng(seed).standard_normal(tuple(shape))
    x = magnitude * z if offset == 0 else magnitude * (1.0 + z / offset)
    return x.astype(np.float32)


def affine_params(shape: Sequence[int], seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """gamma of either sign with |gamma| in [0.5, 2], and beta ~ N(0, 1), of the given normalized shape."""
    rng = np.random.default_rng(seed)
    gamma = rng.uniform(0.5, 2.0, tuple(shape)) * rng.choice([-1.0, 1.0], tuple(shape))
    return gamma.astype(np.float32), rng.standard_normal(tuple(shape)).astype(np.float32)


def row_bound(ref: np.ndarray, D: int, gamma: np.ndarray | None) -> np.ndarray:
    """Per-row bound: NORMALIZE_ATOL * max(1, max|gamma|) + FLOAT32_ULP * max|reference output of the row|."""
    g = 1.0 if gamma is None else max(1.0, float(np.abs(gamma).max()))
    out_max: np.ndarray = np.abs(ref.reshape(-1, D)).max(axis=1)
    return NORMALIZE_ATOL * g + FLOAT32_ULP * out_max


def row_errors(out: np.ndarray, ref: np.ndarray, D: int) -> np.ndarray:
    """Per-row max abs difference in float64; inf for a row holding NaN or inf."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(out.reshape(-1, D).astype(np.float64) - ref.reshape(-1, D))
    return np.where(np.isfinite(diff).all(axis=1), diff.max(axis=1, initial=0.0), np.inf)


def plain_onnx(k: int, eps: float) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """onnxruntime's own LayerNormalization (opset 18, axis -k): what a plain ONNX export runs."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("X", "G", "B", "Y")]
    node = helper.make_node("LayerNormalization", ["X", "G", "B"], ["Y"], axis=-k, epsilon=eps)
    graph = helper.make_graph([node], "plain_layernorm", io[:3], io[3:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return lambda x, g, b: sess.run(None, {"X": x, "G": g, "B": b})[0]


def plain_torch(x: np.ndarray, k: int, eps: float, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """torch.nn.functional.layer_norm in float32 on CPU."""
    import torch

    t = torch.nn.functional.layer_norm(
        torch.from_numpy(x), x.shape[-k:], torch.from_numpy(gamma), torch.from_numpy(beta), eps
    )
    return t.numpy()


def graph_only(
    model: Model, x: np.ndarray, k: int, mode: str, gamma: np.ndarray, beta: np.ndarray, condition: bool
) -> np.ndarray:
    """normserve's graph alone: fed the raw rows, or the conditioned rows without refine_rows."""
    D = math.prod(x.shape[-k:])
    x2 = x.reshape(-1, D)
    if condition:
        rows = condition_rows(x2, EPS, mode)
        x2, eps_var, eps_std = rows.x, rows.eps_var, rows.eps_std
    else:
        e, zero = np.full((len(x2), 1), EPS, np.float32), np.zeros((len(x2), 1), np.float32)
        eps_var, eps_std = (e, zero) if mode == "var" else (zero, e)
    feeds = {"input": x2, "gamma": gamma.reshape(D), "beta": beta.reshape(D), "eps_var": eps_var, "eps_std": eps_std}
    with np.errstate(over="ignore", invalid="ignore"):
        out: np.ndarray = model.run(feeds, ["output"])[0]
    return out.reshape(x.shape)


def measure_point(
    runtime: Runtime, x: np.ndarray, case: tuple[str, int, bool], plain: dict[str, Any]
) -> dict[str, Any]:
    """Max abs error and error / bound of every implementation on one grid point."""
    mode, k, affine = case
    D = math.prod(x.shape[-k:])
    gamma, beta = affine_params(x.shape[-k:]) if affine else (None, None)
    g = np.ones(x.shape[-k:], np.float32) if gamma is None else gamma
    b = np.zeros(x.shape[-k:], np.float32) if beta is None else beta
    ref = reference.layer_norm(x, k, EPS, mode, gamma, beta).output
    bound = row_bound(ref, D, gamma)
    model = runtime.get("layernorm")
    outs = {
        "normserve": model.infer(NormalizeInput(x, k, EPS, mode, gamma, beta)).output,
        "unconditioned": graph_only(model, x, k, mode, g, b, condition=False),
        "unrefined": graph_only(model, x, k, mode, g, b, condition=True),
    }
    if mode == "var":  # torch and ONNX have no sqrt(var) + eps mode
        with np.errstate(over="ignore", invalid="ignore"):
            outs["onnxruntime"] = plain[f"onnx{k}"](x, g, b)
            if plain["torch"]:
                outs["torch"] = plain_torch(x, k, EPS, g, b)
    res: dict[str, Any] = {}
    for name, out in outs.items():
        err = row_errors(out, ref, D)
        res[name] = (float(err.max()), float((err / bound).max()))
    return res


def run_grid(runtime: Runtime, shape: Sequence[int], cases: Sequence[tuple[str, int, bool]]) -> dict[Any, Any]:
    """{(case, offset, magnitude): {impl: (max abs error, max error / bound)}} over the whole grid."""
    plain: dict[str, Any] = {f"onnx{k}": plain_onnx(k, EPS) for k in (1, 2)}
    with one_torch_thread() as has_torch:
        plain["torch"] = has_torch
        table = {}
        for i, (offset, magnitude) in enumerate((o, m) for o in OFFSETS for m in MAGNITUDES):
            x = grid_point(offset, magnitude, shape, seed=i)
            for case in cases:
                table[(case, offset, magnitude)] = measure_point(runtime, x, case, plain)
    return table


@contextmanager
def one_torch_thread() -> Iterator[bool]:
    """torch at one intra-op thread meanwhile, then as it was; yields whether torch is installed at all.

    Rows are independent, so one thread gives the same numbers without spinning up a pool per call.
    """
    try:
        import torch
    except ImportError:  # the runtime image has no torch; the table then says so
        yield False
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield True
    finally:
        torch.set_num_threads(threads)


def time_conditioning(
    runtime: Runtime, shape: Sequence[int], repeats: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, float]:
    """Median ms of: the graph on raw rows, on conditioned rows (with refinement), and all of LayerNormModel.infer."""
    model = runtime.get("layernorm")
    x = np.random.default_rng(7).standard_normal(tuple(shape)).astype(np.float32)
    D = shape[-1]
    x2, g, b = x.reshape(-1, D), np.ones(D, np.float32), np.zeros(D, np.float32)
    raw_feeds = {"input": x2, "gamma": g, "beta": b, "eps_var": np.full((len(x2), 1), EPS, np.float32)}
    raw_feeds["eps_std"] = np.zeros((len(x2), 1), np.float32)

    def raw() -> None:
        model.run(raw_feeds, ["output"])

    def conditioned() -> None:
        rows = condition_rows(x2, EPS, "var")
        feeds = {"input": rows.x, "gamma": g, "beta": b, "eps_var": rows.eps_var, "eps_std": rows.eps_std}
        out, mean, inv = model.run(feeds, ["output", "mean", "inv_std_dev"])
        refine_rows(rows, out, mean, inv, g, b)

    def full() -> None:
        runtime.get("layernorm").infer(NormalizeInput(x, 1))

    fns = {"raw": raw, "conditioned": conditioned, "normalize": full}
    times: dict[str, list[float]] = {n: [] for n in fns}
    for i in range(repeats + 3):  # interleaved, so that drift on a shared machine hits all three alike
        for name, fn in fns.items():
            start = clock()
            fn()
            if i >= 3:  # the first rounds warm caches and thread pools
                times[name].append((clock() - start) * 1e3)
    return {name: float(np.median(t)) for name, t in times.items()}


def time_both(model_dir: Path, shape: Sequence[int], repeats: int) -> list[tuple[str, dict[str, float]]]:
    """Wall clock with the default session (all cores), and the calling thread's CPU time with one
    onnxruntime thread: the second counts all the work and hardly moves when other jobs share the machine."""
    timings = []
    for threads, clock, label in (
        (0, time.perf_counter, "all cores, wall clock"),
        (1, time.thread_time, "1 thread, CPU time"),
    ):
        runtime = Runtime(Settings(model_dir=model_dir, intra_op_threads=threads))
        runtime.load()
        timings.append((label, time_conditioning(runtime, shape, repeats, clock)))
    return timings


def main(argv: Sequence[str] | None = None) -> int:
    """Compute the fidelity tables and timing, write fidelity.md and fidelity.png; 1 if normserve misses a bound
    (float32: error / bound above 1; FP16 and BF16: more than 1 ulp)."""
    p = argparse.ArgumentParser(prog="fidelity", description=__doc__)
    p.add_argument("--models", type=Path, default=ROOT / "models", help="folder with layernorm.onnx and manifest.json")
    p.add_argument("--out-dir", type=Path, default=ROOT / "docs", help="where fidelity.md and fidelity.png go")
    p.add_argument("--shape", default="4,16,768", help="shape of each grid point's tensor")
    p.add_argument("--timing-shape", default="8,128,768", help="shape for the conditioning cost")
    p.add_argument("--repeats", type=int, default=50, help="timed runs per path (the median is reported)")
    args = p.parse_args(argv)
    shape = [int(s) for s in args.shape.split(",")]
    timing_shape = [int(s) for s in args.timing_shape.split(",")]
    runtime = Runtime(Settings(model_dir=args.models))
    runtime.load()
    print(f"fidelity: {len(OFFSETS) * len(MAGNITUDES)} grid points x {len(CASES)} cases of {shape}", file=sys.stderr)
    table = run_grid(runtime, shape, CASES)
    print(f"fidelity: timing {timing_shape}, {args.repeats} runs per path", file=sys.stderr)
    timing = time_both(args.models, timing_shape, args.repeats)
    print(f"fidelity: FP16 and BF16 grids of {shape}", file=sys.stderr)
    with one_torch_thread():
        half = fidelity_half.run_grid(runtime, shape)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_plot(table, args.out_dir / "fidelity.png")
    worst = write_markdown(table, timing, shape, timing_shape, args.repeats, args.out_dir / "fidelity.md")
    half_worst = fidelity_half.write_markdown(half, shape, time.strftime("%Y-%m-%d"), args.out_dir / "fidelity.md")
    print(f"fidelity: normserve worst error / bound {worst:.3g}, worst half ulps {half_worst:.3g}", file=sys.stderr)
    return 0 if worst <= 1.0 and half_worst <= 1.0 else 1


def environment() -> dict[str, str]:
    """Versions and machine, for the report."""
    import onnxruntime

    env = {"python": platform.python_version(), "numpy": np.__version__, "onnxruntime": onnxruntime.__version__}
    try:
        import torch

        env["torch"] = torch.__version__
    except ImportError:
        env["torch"] = "not installed"
    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), platform.machine())
    env["machine"] = f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
    return env


# ---- the report: docs/fidelity.png and docs/fidelity.md ------------------------------------------

HEADLINE = ("var", 1, False)  # the setting, the only one torch and ONNX LayerNormalization have


def curves(table: dict[Any, Any], impl: str, axis: str) -> list[float]:
    """Max abs error of impl on the headline case: against offset (max over the magnitudes whose squares
    fit float32, so that cancellation shows alone), or against magnitude (max over every offset)."""
    if axis == "offset":
        moderate = [m for m in MAGNITUDES if m <= 1e10]
        return [max(table[(HEADLINE, o, m)][impl][0] for m in moderate) for o in OFFSETS]
    return [max(table[(HEADLINE, o, m)][impl][0] for o in OFFSETS) for m in MAGNITUDES]


def write_plot(table: dict[Any, Any], path: Path) -> None:
    """Log-log: max error against offset / std and against magnitude, one line per implementation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.13, top=0.85, wspace=0.25)
    ceiling, floor = 1e3, 1e-40  # non-finite outputs are drawn at the ceiling, exact ones at the floor
    for ax, axis, xs in ((axes[0], "offset", [max(o, 1.0) for o in OFFSETS]), (axes[1], "magnitude", MAGNITUDES)):
        for impl, style in zip(IMPLS, ("o-", "s-", "^-"), strict=True):
            if impl not in table[(HEADLINE, OFFSETS[0], MAGNITUDES[0])]:
                continue
            ys = np.clip(curves(table, impl, axis), floor, ceiling)
            ax.plot(xs, ys, style, label=impl if impl != "onnxruntime" else "onnxruntime LayerNormalization")
        ax.axhline(NORMALIZE_ATOL, color="grey", ls="--", lw=1, label="bound 1e-5 (+ output rounding)")
        ax.set(xscale="log", yscale="log", ylabel="max |error| vs float64")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set(xlabel="row offset / row std (0 drawn at 1)", title="against offset (magnitudes 1e-30 to 1e10)")
    axes[1].set(xlabel="row magnitude", title="against magnitude (max over offsets)", ylim=(floor / 10, ceiling * 10))
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"LayerNorm float32 vs float64 reference, eps {EPS:g}; errors at {ceiling:g} are NaN or inf")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fmt(err: float) -> str:
    return "**NaN/inf**" if not math.isfinite(err) else ("0" if err == 0 else f"{err:.2g}")


def axis_table(table: dict[Any, Any], axis: str, label: str) -> list[str]:
    impls = [i for i in ("torch", "onnxruntime", "unconditioned", "normserve") if i in table[next(iter(table))]]
    cols = {"torch": "torch", "onnxruntime": "ORT LayerNormalization", "unconditioned": "same graph, raw rows"}
    lines = [f"| {label} | " + " | ".join(cols.get(i, "**normserve**") for i in impls) + " |"]
    lines.append("|---" * (len(impls) + 1) + "|")
    keys = OFFSETS if axis == "offset" else MAGNITUDES
    series = {i: curves(table, i, axis) for i in impls}
    for j, key in enumerate(keys):
        lines.append(f"| {key:g} | " + " | ".join(fmt(series[i][j]) for i in impls) + " |")
    return lines


def worst(table: dict[Any, Any], impl: str, case: tuple[str, int, bool] | None = None) -> tuple[float, float, Any]:
    """(max abs error, max error / bound, where) of impl over the grid, or over one case of it."""
    items = [(v[impl], key) for key, v in table.items() if impl in v and (case is None or key[0] == case)]
    (err, _), _ = max(items, key=lambda it: it[0][0])
    (_, ratio), where = max(items, key=lambda it: it[0][1])
    return err, ratio, where


def case_lines(table: dict[Any, Any]) -> list[str]:
    """normserve on every case of the grid: its worst error, error / bound, and that without refinement."""
    lines = ["| eps_mode | k | gamma, beta | max abs error | error / bound | without refinement |", "|---" * 6 + "|"]
    for case in CASES:
        e, r, _ = worst(table, "normserve", case)
        lines.append(
            f"| {case[0]} | {case[1]} | {'yes' if case[2] else 'no'} | {e:.2g} | {r:.3f} | "
            f"{worst(table, 'unrefined', case)[1]:.3f} |"
        )
    return lines


def cost_lines(timing: list[tuple[str, dict[str, float]]], timing_shape: Sequence[int], repeats: int) -> list[str]:
    """The cost table of the measured block, then the versions and the machine."""
    lines = ["", f"Cost at {timing_shape} (median of {repeats} interleaved runs, ms):", ""]
    lines += [
        "| onnxruntime, clock | graph on raw rows | conditioned + refined | ratio | all of LayerNormModel.infer |"
    ]
    lines += ["|---|---|---|---|---|"]
    for label, t in timing:
        cost = t["conditioned"] / t["raw"]
        lines += [f"| {label} | {t['raw']:.2f} | {t['conditioned']:.2f} | **{cost:.2f}x** | {t['normalize']:.2f} |"]
    env = environment()
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in env.items() if k != "machine") + "."]
    return [*lines, f"Machine: {env['machine']} (shared with other jobs: timings are noisy).", ""]


BEGIN, END = "<!-- fidelity:begin (written by scripts/fidelity.py) -->", "<!-- fidelity:end -->"


def write_markdown(
    table: dict[Any, Any],
    timing: list[tuple[str, dict[str, float]]],
    shape: Sequence[int],
    timing_shape: Sequence[int],
    repeats: int,
    path: Path,
) -> float:
    """Write the measured block of path (between BEGIN and END, keeping the prose around it); the worst ratio."""
    err, ratio, where = worst(table, "normserve")
    lines = [BEGIN, "", f"Measured by `python scripts/fidelity.py` on {time.strftime('%Y-%m-%d')}: {shape} float32"]
    lines += [f"per grid point, eps {EPS:g}, {len(OFFSETS)} offsets x {len(MAGNITUDES)} magnitudes.", ""]
    (mode, k, affine), off, mag = where
    at = f"eps_mode {mode}, k {k}, {'with' if affine else 'no'} gamma/beta, offset {off:g} x std, magnitude {mag:g}"
    lines += [f"- **normserve, every case: worst error / bound {ratio:.3f}** ({at}); worst absolute error {err:.2g}."]
    for impl in ("onnxruntime", "torch"):
        if impl in table[next(iter(table))]:
            e, r, w = worst(table, impl, HEADLINE)
            bad = sum(1 for k, v in table.items() if impl in v and v[impl][1] > 1)
            lines.append(f"- {impl}: worst error {fmt(e)} ({w[1]:g} x std offset, magnitude {w[2]:g}); misses the")
            lines.append(f"  bound at {bad} of {len(OFFSETS) * len(MAGNITUDES) * 4} points (mode var).")
    e, r, _ = worst(table, "unrefined")
    lines += [f"- conditioning alone, without refine_rows (its gate: REFINE_TOL = {REFINE_TOL:g}): worst error"]
    lines += [f"  {e:.2g}, error / bound {r:.3f}.", ""]
    lines += ["Mode var, k = 1, no gamma/beta. Max |error| against offset, over magnitudes 1e-30 to 1e10"]
    lines += ["(where float32 squares cannot overflow, so that cancellation shows alone):", ""]
    lines += [*axis_table(table, "offset", "offset / std"), "", "And over the offsets of each magnitude:", ""]
    lines += [*axis_table(table, "magnitude", "magnitude"), "", "normserve on every case of the grid:", ""]
    lines += [*case_lines(table), *cost_lines(timing, timing_shape, repeats), END]
    text = path.read_text() if path.is_file() else ""
    head, _, rest = text.partition(BEGIN)
    tail = rest.partition(END)[2] if rest else ""
    path.write_text(head + "\n".join(lines) + tail if rest else "\n".join(lines) + "\n" + text)
    return ratio


if __name__ == "__main__":
    sys.exit(main())
