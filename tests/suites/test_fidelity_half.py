"""Issue 26: scripts/fidelity_half.py, the FP16 and BF16 grids of docs/fidelity.md, measured in ulps of the half type.

An output within one unit in the last place of the float64 result on the same half-precision
values is faithful; normserve is asserted to be faithful on every point of a small grid, where
torch's own half-precision LayerNorm overflows.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from app.core import reference
from app.core.runtime import Runtime
from app.settings import Settings
from tests.live_server import ROOT


def _load_script() -> Any:
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("fidelity_half", ROOT / "scripts" / "fidelity_half.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fidelity_half"] = module
    spec.loader.exec_module(module)
    return module


fh = _load_script()
BF16 = ml_dtypes.bfloat16
SHAPE = (2, 64)  # each grid point: 2 rows of 64


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    rt = Runtime(Settings(model_dir=ROOT / "models"))
    rt.load()
    return rt


@pytest.fixture(scope="module")
def table(runtime: Runtime) -> dict[Any, Any]:
    return dict(fh.run_grid(runtime, SHAPE))


@pytest.mark.parametrize(
    ("out", "ref", "datatype", "expected"),
    [
        pytest.param(1 + 2**-10, 1.0, "FP16", 1.0, id="fp16-next-after-1"),
        pytest.param(1.0, 1 + 2**-11, "FP16", 0.5, id="fp16-halfway"),
        pytest.param(2.0, 2 - 2**-12, "FP16", 0.25, id="fp16-rounded-up-across-a-binade"),
        pytest.param(2**-24, 0.0, "FP16", 1.0, id="fp16-smallest-subnormal-for-zero"),
        pytest.param(0.0, 2**-20, "FP16", 16.0, id="fp16-zero-for-a-subnormal"),
        pytest.param(1 + 2**-7, 1.0, "BF16", 1.0, id="bf16-next-after-1"),
        pytest.param(2.0**100, 2.0**100, "BF16", 0.0, id="bf16-exact"),
        pytest.param(2**-133, 0.0, "BF16", 1.0, id="bf16-smallest-subnormal-for-zero"),
        pytest.param(math.nan, 1.0, "FP16", math.inf, id="nan-is-infinitely-far"),
        pytest.param(math.inf, 1.0, "BF16", math.inf, id="inf-is-infinitely-far"),
    ],
)
def test_ulps_counts_units_in_the_last_place_of_the_half_type_at_the_truth(
    out: float, ref: float, datatype: str, expected: float
) -> None:
    got = fh.ulps(np.asarray([out], fh.HALF[datatype]), np.asarray([ref]), datatype)
    assert got.tolist() == [expected]


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_the_truth_rounded_to_nearest_is_within_half_an_ulp(datatype: str) -> None:
    ref = np.random.default_rng(3).standard_normal(10_000) * np.logspace(-6, 4, 10_000)
    assert fh.ulps(ref.astype(fh.HALF[datatype]), ref, datatype).max() <= 0.5


def test_tally_counts_each_kind_of_miss() -> None:
    ref = np.asarray([1.0, 1.0, 1.0, 0.5, 2**-20])
    out = np.asarray([1.0, math.nan, math.inf, 0.0, 0.0], np.float16)
    expected = {"worst": math.inf, "abs": math.inf, "beyond": 4, "nonfinite": 2, "zero": 2, "elements": 5}
    assert fh.tally(out, ref, "FP16") == expected
    finite = fh.tally(out[[0, 3]], ref[[0, 3]], "FP16")
    assert (finite["worst"], finite["abs"], finite["zero"]) == (2**10, 0.5, 1)  # 0.5 off where the spacing is 2**-11


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_grid_points_are_finite_half_values_and_infinite_offset_is_a_constant_row(datatype: str) -> None:
    for magnitude in fh.MAGNITUDES[datatype]:
        x = fh.grid_point(datatype, 0.0, magnitude, (3, 768))
        assert x.dtype == fh.HALF[datatype] and np.isfinite(x.astype(np.float64)).all()
        row = fh.grid_point(datatype, math.inf, magnitude, (1, 16))
        assert (row == row.flat[0]).all() and row.flat[0] == np.asarray(magnitude).astype(fh.HALF[datatype])


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_normserve_is_within_one_ulp_at_every_grid_point(table: dict[Any, Any], datatype: str) -> None:
    cells = {key: v["normserve"] for key, v in table.items() if key[0] == datatype}
    assert len(cells) == len(fh.OFFSETS) * len(fh.MAGNITUDES[datatype]) * len(fh.CASES)
    misses = {key: c["worst"] for key, c in cells.items() if not c["worst"] <= 1}
    assert not misses


@pytest.mark.parametrize("magnitude", [1e19, 1e30, 1e37])
def test_torch_bf16_layer_norm_overflows_where_normserve_is_faithful(table: dict[Any, Any], magnitude: float) -> None:
    cell = table[("BF16", False, 0.0, magnitude)]
    assert cell["normserve"]["worst"] <= 1
    assert cell["torch"]["worst"] > 100  # x**2 past FP32's max: torch's rows come back NaN, inf or all wrong


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_onnxruntime_is_measured_or_its_error_is_reported(table: dict[Any, Any], datatype: str) -> None:
    cells = [v["onnxruntime"] for key, v in table.items() if key[0] == datatype]
    assert all(isinstance(c, dict) for c in cells) or all(isinstance(c, str) and c for c in cells)
    x = fh.grid_point(datatype, 0.0, 1.0, SHAPE)
    run = fh.plain_onnx(datatype)
    if isinstance(run, str):
        pytest.skip(f"onnxruntime has no CPU kernel for {datatype}: {run}")
    ones, zeros = np.ones(SHAPE[-1], x.dtype), np.zeros(SHAPE[-1], x.dtype)
    ref = reference.layer_norm(x.astype(np.float64)).output
    assert fh.ulps(run(x, ones, zeros), ref, datatype).max() <= 4  # plain rows: a few ulps at most, on any CPU


def test_the_report_block_replaces_its_markers_and_keeps_the_prose(table: dict[Any, Any], tmp_path: Path) -> None:
    path = tmp_path / "fidelity.md"
    path.write_text(f"# Fidelity\n\nprose\n\n{fh.BEGIN}\nold figures\n{fh.END}\n\nafter\n")
    worst = fh.write_markdown(table, SHAPE, "2026-11-26", path)
    text = path.read_text()
    assert worst <= 1 and "old figures" not in text
    assert text.startswith(f"# Fidelity\n\nprose\n\n{fh.BEGIN}\n") and text.endswith(f"{fh.END}\n\nafter\n")
    assert (
        "| datatype | implementation | worst ulps | at (offset / std, magnitude, gamma/beta) | worst abs error |"
        in text
    )
    for datatype in ("FP16", "BF16"):
        assert all(f"| {datatype} | {impl} |" in text for impl in ("torch", "onnxruntime", "**normserve**"))
        assert f"| {datatype}: magnitude | torch | onnxruntime | **normserve** |" in text
    assert "| constant rows |" in text


def test_the_report_block_is_appended_to_a_page_without_markers(table: dict[Any, Any], tmp_path: Path) -> None:
    path = tmp_path / "fidelity.md"
    path.write_text("# Fidelity\n")
    fh.write_markdown(table, SHAPE, "2026-11-26", path)
    assert path.read_text().startswith(f"# Fidelity\n\n{fh.BEGIN}\n")
    assert path.read_text().endswith(f"{fh.END}\n")
