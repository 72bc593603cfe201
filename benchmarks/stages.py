"""The profiles of the in-process and memory misses: the conditioned path stage by stage, the idle worker's RSS.

`conditioned_stages` times each stage that app/core/layernorm.py's fused path runs, by calling the very
functions it calls on the same input (so it follows the path as the path changes), beside the whole call;
what the stages leave over is the rest (reshapes, the chunking, the output object, and what runs slower inside
the whole call than alone, its caches cold).
`idle_rss` starts a Python that imports the serving modules, then loads the default models, reading its RSS
after each: what the idle worker of the memory section is made of.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from app.core.conditioning import correct_rows, moments
from app.core.dataplane import NormalizeInput
from app.core.kernels import check_kernel, run_kernel
from app.core.layernorm import LayerNormModel, _unit_affine
from app.core.runtime import Runtime
from app.core.tensors import check_finite
from benchmarks import servers
from benchmarks.inprocess import measure, sample

EPS = 1e-5


def _stage_calls(model: LayerNormModel, x: np.ndarray) -> dict[str, Callable[[], object]]:
    """Each stage of LayerNormModel._run_rows and normalize on x's rows (gamma 1, beta 0, eps 1e-5, mode var)."""
    x2 = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    gamma, beta = _unit_affine(x2.shape[1])
    kernel = model.kernel.session(EPS)
    assert kernel is not None  # eps 1e-5 in mode var: the fused kernel's case
    feeds = {"input": x2, "gamma": gamma, "beta": beta}
    mean, var = moments(x2)
    outputs = run_kernel(kernel, feeds)
    check = check_kernel(mean, var, EPS, outputs, 1.0, 0.0)
    out = outputs[0].copy()  # correct_rows writes into its rows: a copy keeps the kernel's own for the others
    req = NormalizeInput(x, 1)

    def exact() -> object:
        correct_rows(out, check.refine, check.ratio, check.shift, gamma, beta)
        return model.exact_rows(x2[check.exact], req, gamma, beta) if check.exact.size else None

    return {
        "NormalizeInput (the data plane's checks)": lambda: NormalizeInput(x, 1),
        "float64 moments": lambda: moments(x2),
        "fused kernel run": lambda: run_kernel(kernel, feeds),
        "kernel check": lambda: check_kernel(mean, var, EPS, outputs, 1.0, 0.0),
        "correct_rows and exact rows": exact,
        "check_finite": lambda: check_finite(outputs[0], "output"),
    }


def conditioned_stages(runtime: Runtime, shapes: list[tuple[int, ...]], budget_s: float) -> list[dict[str, Any]]:
    """Per shape: the median ms of the whole conditioned call and of each of its stages, and the rest."""
    model = runtime.get("layernorm")
    assert isinstance(model, LayerNormModel)
    rows = []
    for shape in shapes:
        x = sample(shape)
        whole = measure(lambda: model.infer(NormalizeInput(x, 1)), budget_s).median_s  # noqa: B023 - called here
        stages = {name: measure(fn, budget_s).median_s for name, fn in _stage_calls(model, x).items()}
        stages["the rest"] = max(0.0, whole - sum(stages.values()))
        rows.append({"shape": shape, "whole_s": whole, "stages_s": stages})
    return rows


# Run in a fresh interpreter: this process has torch and the benchmark's own imports.
IDLE_RSS = """
import sys
from pathlib import Path
def rss():
    line = next(l for l in Path('/proc/self/status').read_text().splitlines() if l.startswith('VmRSS:'))
    return int(line.split()[1]) * 1024
figures = {'interpreter': rss()}
import app.main
figures['serving modules imported'] = rss()
from app.core.runtime import Runtime
from app.settings import Settings
runtime = Runtime(Settings(model_dir=sys.argv[1]))
runtime.load()
figures['default models loaded'] = rss()
print(__import__('json').dumps(figures))
"""


def idle_rss() -> dict[str, Any]:
    """RSS in bytes of a fresh interpreter, after importing app.main, after loading the default models."""
    cmd = [sys.executable, "-c", IDLE_RSS, str(servers.ROOT / "models")]
    env = {"PYTHONPATH": str(servers.ROOT), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=servers.ROOT)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["no message"])[-1]}
    figures: dict[str, Any] = orjson.loads(proc.stdout)
    return figures
