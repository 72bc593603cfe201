"""benchmarks/stages.py: the conditioned path stage by stage on the repo's layernorm, the idle RSS step by step."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import cast

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks/ lives beside app/ in the checkout

from app.core import reference  # noqa: E402
from app.core.layernorm import LayerNormModel  # noqa: E402
from app.core.runtime import Runtime  # noqa: E402
from app.settings import Settings  # noqa: E402
from benchmarks import stages  # noqa: E402
from benchmarks.inprocess import sample  # noqa: E402

STAGES = [
    "NormalizeInput (the data plane's checks)",
    "float64 moments",
    "fused kernel run",
    "kernel check",
    "correct_rows and exact rows",
    "check_finite",
    "the rest",
]


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    loaded = Runtime(Settings(model_dir=ROOT / "models"))
    loaded.load()
    return loaded


@pytest.mark.parametrize("shape", [(1, 8, 64), (4, 1000)])
def test_every_stage_of_the_conditioned_path_is_timed_and_the_rest_makes_up_the_whole(
    runtime: Runtime, shape: tuple[int, ...]
) -> None:
    (row,) = stages.conditioned_stages(runtime, [shape], 0.01)
    assert row["shape"] == shape and list(row["stages_s"]) == STAGES
    assert all(s >= 0 for s in row["stages_s"].values()) and row["whole_s"] > 0
    assert sum(row["stages_s"].values()) >= row["whole_s"]  # the rest is what the stages leave over, never < 0


def test_the_stages_call_what_the_path_calls_on_its_rows(runtime: Runtime) -> None:
    model = runtime.get("layernorm")
    assert isinstance(model, LayerNormModel)
    x = sample((2, 8, 64))
    calls, chunks = stages._stage_calls(model, x)
    assert chunks == 1  # 1,024 elements: one kernel run
    mean, var = cast(tuple[np.ndarray, np.ndarray], calls["float64 moments"]())
    want = reference.layer_norm(x, 1, 1e-5, "var")
    assert np.array_equal(mean, want.mean.reshape(-1)) and np.array_equal(var, want.var.reshape(-1))
    output = cast(list[np.ndarray], calls["fused kernel run"]())[0]
    ours = model.infer(model.request(x)).output.reshape(-1, 64)
    assert np.abs(output - ours).max() <= 2e-5  # the kernel's raw rows before their check: within the promise


def test_the_idle_rss_grows_with_each_step_of_a_worker_start() -> None:
    rss = stages.idle_rss()
    assert list(rss) == ["interpreter", "serving modules imported", "default models loaded"]
    assert 0 < rss["interpreter"] < rss["serving modules imported"] < rss["default models loaded"]


def test_interleaved_calls_each_once_per_round_after_one_warm_up_each() -> None:
    order: list[str] = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("whole", "a", "b")}
    medians = stages.interleaved(calls, 0.0)  # no budget: the 3 rounds at least
    assert order == ["whole", "a", "b"] * 4  # the warm-up round, then 3 timed
    assert list(medians) == ["whole", "a", "b"] and all(m >= 0 for m in medians.values())


@pytest.mark.parametrize(("shape", "chunks"), [((8, 128, 768), 1024 / 341), ((2, 1 << 18), 2.0), ((3, 64), 1.0)])
def test_the_per_chunk_stages_scale_by_the_row_chunks_the_path_runs(
    runtime: Runtime, shape: tuple[int, ...], chunks: float
) -> None:
    model = runtime.get("layernorm")
    assert isinstance(model, LayerNormModel)
    assert stages._stage_calls(model, sample(shape))[1] == chunks
