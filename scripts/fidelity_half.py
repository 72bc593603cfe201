"""Fidelity of FP16 and BF16 LayerNorm in ulps of the half type: torch, plain onnxruntime and normserve.

scripts/fidelity.py runs it after its float32 grid and writes its block of docs/fidelity.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.core import reference
from app.core.dataplane import NormalizeInput
from app.core.halfprecision import HALF_DTYPES, limit, ulp_errors
from app.core.runtime import Runtime

EPS = 1e-5
HALF = HALF_DTYPES
IMPLS = ("torch", "onnxruntime", "normserve")
# A row's center in units of its std; inf: constant rows (every value the magnitude itself).
OFFSETS = (0.0, 1e1, 1e2, 1e3, 1e4, math.inf)
MAGNITUDES = {
    # FP16's subnormals (6e-8 to 6e-5), where its spacing is 0.5 and more (1e3, 1e4), squares past FP16's max (> 256).
    "FP16": (6e-8, 1e-6, 6e-5, 1e-2, 1.0, 300.0, 1e3, 1e4),
    # BF16 has FP32's range: its subnormals (1e-38), and squares past FP32's max (1e19 and up).
    "BF16": (1e-38, 1e-20, 1e-2, 1.0, 300.0, 1e4, 1e19, 1e30, 1e37),
}
CASES = (False, True)  # without and with gamma and beta, in mode var (the only one torch and ONNX have)
Plain = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def grid_point(datatype: str, offset: float, magnitude: float, shape: Sequence[int], seed: int = 0) -> np.ndarray:
    """Half-precision rows magnitude * (1 + z / offset) (magnitude * z at offset 0), clipped to the type's range."""
    z = np.random.default_rng(seed).standard_normal(tuple(shape))
    x = magnitude * z if offset == 0 else magnitude * (1.0 + z / offset)
    top = limit(datatype)
    return np.clip(x, -top, top).astype(HALF[datatype])


def affine_params(datatype: str, D: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """gamma of either sign with |gamma| in [0.5, 2], beta ~ N(0, 1), rounded to the half type."""
    rng = np.random.default_rng(seed)
    gamma = rng.uniform(0.5, 2.0, D) * rng.choice([-1.0, 1.0], D)
    return gamma.astype(HALF[datatype]), rng.standard_normal(D).astype(HALF[datatype])


def ulps(out: np.ndarray, ref: np.ndarray, datatype: str) -> np.ndarray:
    """|out - ref| in units in the last place of the half type at ref's binade; inf where out is NaN or inf."""
    with np.errstate(invalid="ignore", over="ignore"):
        err = ulp_errors(out, ref, datatype)
    return np.where(np.isfinite(out.astype(np.float64)), err, np.inf)


def tally(out: np.ndarray, ref: np.ndarray, datatype: str) -> dict[str, float]:
    """Worst ulps and worst absolute error, and how many elements are beyond 1 ulp, NaN or inf, and zero where
    more than 1 ulp is not."""
    err = ulps(out, ref, datatype)
    wide = out.astype(np.float64)
    with np.errstate(invalid="ignore"):
        absolute = np.abs(wide - ref)
    return {
        "worst": float(err.max()),
        "abs": float(absolute.max()) if np.isfinite(absolute).all() else math.inf,
        "beyond": int((err > 1).sum()),
        "nonfinite": int((~np.isfinite(wide)).sum()),
        "zero": int(((wide == 0) & (err > 1)).sum()),
        "elements": int(err.size),
    }


def plain_torch(datatype: str) -> Plain:
    """torch.nn.functional.layer_norm on float16 or bfloat16 CPU tensors, over the last dim."""
    import torch

    tdtype = {"FP16": torch.float16, "BF16": torch.bfloat16}[datatype]

    def run(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        t, tg, tb = (torch.from_numpy(a.astype(np.float32)).to(tdtype) for a in (x, g, b))  # exact widenings
        y = torch.nn.functional.layer_norm(t, (x.shape[-1],), tg, tb, EPS)
        return y.to(torch.float32).numpy().astype(HALF[datatype])

    return run


def plain_onnx(datatype: str) -> Plain | str:
    """onnxruntime's own LayerNormalization (opset 17, axis -1) on half tensors; the error if it has no kernel."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    elem = {"FP16": TensorProto.FLOAT16, "BF16": TensorProto.BFLOAT16}[datatype]
    io = [helper.make_tensor_value_info(n, elem, None) for n in ("X", "G", "B", "Y")]
    node = helper.make_node("LayerNormalization", ["X", "G", "B"], ["Y"], axis=-1, epsilon=EPS)
    graph = helper.make_graph([node], "plain_layernorm", io[:3], io[3:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        run = _bound_run(sess, elem)
        probe = np.ones((1, 4), HALF[datatype])
        run(probe, probe[0], probe[0])
    except Exception as e:  # no kernel for the type: the report shows onnxruntime's own message
        return f"{type(e).__name__}: {e}"
    return run


def _bound_run(sess: Any, elem: int) -> Plain:
    """Run sess through OrtValues of the given element type: onnxruntime's numpy bridge has no bfloat16."""
    import onnxruntime as ort

    def value(a: np.ndarray) -> Any:
        bits = np.ascontiguousarray(a).view(np.uint16)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx_element_type=elem)

    def run(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.empty(x.shape, x.dtype)
        binding = sess.io_binding()
        for name, a in (("X", x), ("G", g), ("B", b)):
            binding.bind_ortvalue_input(name, value(a))
        binding.bind_ortvalue_output("Y", value(out))  # onnxruntime writes into out's buffer
        sess.run_with_iobinding(binding)
        return out

    return run


def measure_point(
    runtime: Runtime, datatype: str, x: np.ndarray, affine: bool, plain: dict[str, Plain | str]
) -> dict[str, dict[str, float] | str]:
    """Each implementation's tally on one grid point, or the error that stopped it."""
    D = x.shape[-1]
    gamma, beta = affine_params(datatype, D) if affine else (np.ones(D, x.dtype), np.zeros(D, x.dtype))
    ref = reference.layer_norm(x.astype(np.float64), 1, EPS, "var", gamma.astype(np.float64), beta.astype(np.float64))
    request = NormalizeInput(x, 1, EPS, "var", gamma if affine else None, beta if affine else None, dtype=datatype)
    res: dict[str, dict[str, float] | str] = {
        "normserve": tally(runtime.get("layernorm").infer(request).output, ref.output, datatype)
    }
    for impl, run in plain.items():
        if isinstance(run, str):
            res[impl] = run
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            res[impl] = tally(run(x, gamma, beta), ref.output, datatype)
    return res


def run_grid(runtime: Runtime, shape: Sequence[int]) -> dict[Any, Any]:
    """{(datatype, affine, offset, magnitude): {impl: tally or error}} over both half types' grids."""
    table: dict[Any, Any] = {}
    for datatype in HALF:
        plain: dict[str, Plain | str] = {"onnxruntime": plain_onnx(datatype)}
        if _has_torch():
            plain["torch"] = plain_torch(datatype)
        points = [(o, m) for o in OFFSETS for m in MAGNITUDES[datatype]]
        for i, (offset, magnitude) in enumerate(points):
            x = grid_point(datatype, offset, magnitude, shape, seed=i)
            for affine in CASES:
                table[(datatype, affine, offset, magnitude)] = measure_point(runtime, datatype, x, affine, plain)
    return table


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:  # the runtime image has no torch; the table then leaves it out
        return False
    return True


# ---- the report: its block of docs/fidelity.md ----------------------------------------------------

BEGIN, END = "<!-- fidelity-half:begin (written by scripts/fidelity.py) -->", "<!-- fidelity-half:end -->"
AXES = {"offset": 2, "magnitude": 3}  # where each axis sits in a grid key


def summary(table: dict[Any, Any], datatype: str, impl: str) -> dict[str, Any] | str:
    """impl over one half type's grid: its worst ulps and where, and its counts summed; or the error it gave."""
    cells = [(key, v[impl]) for key, v in table.items() if key[0] == datatype and impl in v]
    errors = [c for _, c in cells if isinstance(c, str)]
    if errors or not cells:
        return errors[0] if errors else "not installed"
    where, worst = max(cells, key=lambda kc: kc[1]["worst"])
    out: dict[str, Any] = {"worst": worst["worst"], "where": where, "points": sum(c["beyond"] > 0 for _, c in cells)}
    out |= {n: sum(c[n] for _, c in cells) for n in ("beyond", "nonfinite", "zero", "elements")}
    out["abs"] = max(c["abs"] for _, c in cells)
    return out | {"of": len(cells)}


def along(table: dict[Any, Any], datatype: str, impl: str, axis: str) -> dict[float, float]:
    """impl's worst ulps at each offset (or magnitude) of one half type's grid, over the rest of it."""
    worst: dict[float, float] = {}
    for key, v in table.items():
        if key[0] == datatype and isinstance(v.get(impl), dict):
            at = key[AXES[axis]]
            worst[at] = max(worst.get(at, 0.0), v[impl]["worst"])
    return worst


def fmt(ulp: float) -> str:
    return "**NaN/inf**" if not math.isfinite(ulp) else ("0" if ulp == 0 else f"{ulp:.3g}")


def summary_table(table: dict[Any, Any]) -> list[str]:
    """One row per half type and implementation: worst ulps, where, and every kind of miss counted."""
    lines = ["| datatype | implementation | worst ulps | at (offset / std, magnitude, gamma/beta) | worst abs error "]
    lines[0] += "| points beyond 1 ulp | elements beyond 1 ulp | NaN or inf | zero for nonzero |"
    lines.append("|---" * 9 + "|")
    for datatype in HALF:
        for impl in IMPLS:
            s = summary(table, datatype, impl)
            name = "**normserve**" if impl == "normserve" else impl
            if isinstance(s, str):
                lines.append(f"| {datatype} | {name} | no CPU kernel: `{s[:200]}` | - | - | - | - | - | - |")
                continue
            _, affine, off, mag = s["where"]
            at = f"{off:g}, {mag:g}, {'yes' if affine else 'no'}"
            lines.append(
                f"| {datatype} | {name} | {fmt(s['worst'])} | {at} | {fmt(s['abs'])} | {s['points']} of {s['of']} "
                f"| {s['beyond']} of {s['elements']} | {s['nonfinite']} | {s['zero']} |"
            )
    return lines


def axis_table(table: dict[Any, Any], datatype: str, axis: str) -> list[str]:
    """Worst ulps of each implementation along one axis of a half type's grid."""
    impls = [i for i in IMPLS if along(table, datatype, i, axis)]
    series = {i: along(table, datatype, i, axis) for i in impls}
    label = "offset / std" if axis == "offset" else "magnitude"
    lines = [f"| {datatype}: {label} | " + " | ".join(f"**{i}**" if i == "normserve" else i for i in impls) + " |"]
    lines.append("|---" * (len(impls) + 1) + "|")
    keys = OFFSETS if axis == "offset" else MAGNITUDES[datatype]
    for key in keys:
        shown = "constant rows" if math.isinf(key) else f"{key:g}"
        lines.append(f"| {shown} | " + " | ".join(fmt(series[i].get(key, math.nan)) for i in impls) + " |")
    return lines


def write_markdown(table: dict[Any, Any], shape: Sequence[int], date: str, path: Path) -> float:
    """Write the half-precision block of path (between BEGIN and END, else at its end); normserve's worst ulps."""
    lines = [BEGIN, "", f"Measured by `python scripts/fidelity.py` on {date}: {list(shape)} FP16 and BF16 values per"]
    lines += [f"grid point, eps {EPS:g}, mode var over the last dim, without and with gamma and beta; errors in ulps"]
    lines += ["of the half type against float64 on the same half-precision values (within 1 ulp: faithful).", ""]
    lines += [*summary_table(table), ""]
    for datatype in HALF:
        lines += [f"{datatype}, worst ulps over the magnitudes of each offset, then over the offsets of each", ""]
        lines += [f"magnitude ({datatype} grid: magnitudes {', '.join(f'{m:g}' for m in MAGNITUDES[datatype])}):", ""]
        lines += [*axis_table(table, datatype, "offset"), "", *axis_table(table, datatype, "magnitude"), ""]
    replace_block(path, BEGIN, END, [*lines, END])
    return max(s["worst"] if isinstance(s, dict) else math.inf for s in (summary(table, d, "normserve") for d in HALF))


def replace_block(path: Path, begin: str, end: str, lines: list[str]) -> None:
    """The lines replace path's block from begin to end, keeping the text around it; appended if it has none."""
    text = path.read_text() if path.is_file() else ""
    head, _, rest = text.partition(begin)
    if not rest:
        path.write_text(text + ("\n" if text else "") + "\n".join(lines) + "\n")
        return
    path.write_text(head + "\n".join(lines) + rest.partition(end)[2])
