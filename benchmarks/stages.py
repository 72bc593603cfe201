"""The profiles of the in-process and memory misses: the conditioned path stage by stage, the idle worker's RSS.

`conditioned_stages` times each stage that app/core/layernorm.py's fused path runs, by calling the very
functions it calls on the same input (so it follows the path as the path changes), interleaved with the whole call;
what the stages leave over is the rest (reshapes, the chunking, the output object, and what runs slower inside
the whole call than alone, its caches cold).
`idle_rss` starts a Python that imports the serving modules, then loads the default models, reading its RSS
after each: what the idle worker of the memory section is made of.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from app.core.conditioning import correct_rows, moments
from app.core.dataplane import NormalizeInput
from app.core.kernels import check_kernel, run_kernel
from app.core.layernorm import CHUNK_ELEMENTS, LayerNormModel, _unit_affine
from app.core.runtime import Runtime
from app.core.tensors import check_finite
from benchmarks import servers
from benchmarks.inprocess import sample

EPS = 1e-5
WHOLE = "the whole call"


def _stage_calls(model: LayerNormModel, x: np.ndarray) -> tuple[dict[str, Callable[[], object]], float]:
    """Each stage of normalize and LayerNormModel._run_rows on x (gamma 1, beta 0, eps 1e-5, mode var), and the
    number of row chunks the path runs: the per-chunk stages run on the first chunk of rows, scaled by it."""
    x2 = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    step = max(1, CHUNK_ELEMENTS // x2.shape[1])  # rows per kernel run, as normalize_rows chunks them
    rows = x2[:step]
    gamma, beta = _unit_affine(x2.shape[1])
    kernel = model.kernel.session(EPS)
    assert kernel is not None  # eps 1e-5 in mode var: the fused kernel's case
    feeds = {"input": rows, "gamma": gamma, "beta": beta}
    mean, var = moments(rows)
    outputs = run_kernel(kernel, feeds)
    check = check_kernel(mean, var, EPS, outputs, 1.0, 0.0)
    out = outputs[0].copy()  # correct_rows writes into its rows: a copy keeps the kernel's own for the others
    req = NormalizeInput(x, 1)

    def exact() -> object:
        correct_rows(out, check.refine, check.ratio, check.shift, gamma, beta)
        return model.exact_rows(rows[check.exact], req, gamma, beta) if check.exact.size else None

    calls: dict[str, Callable[[], object]] = {
        "NormalizeInput (the data plane's checks)": lambda: NormalizeInput(x, 1),
        "float64 moments": lambda: moments(rows),
        "fused kernel run": lambda: run_kernel(kernel, feeds),
        "kernel check": lambda: check_kernel(mean, var, EPS, outputs, 1.0, 0.0),
        "correct_rows and exact rows": exact,
        "check_finite": lambda: check_finite(x, "output"),  # once on the whole output (x's size), not per chunk
    }
    return calls, len(x2) / len(rows)


PER_CHUNK = ("float64 moments", "fused kernel run", "kernel check", "correct_rows and exact rows")


def interleaved(calls: dict[str, Callable[[], object]], budget_s: float, max_rounds: int = 2000) -> dict[str, float]:
    """The median seconds of each call, timed in rounds that call each once (a neighbour's load on a shared
    machine, or a cache another call left cold, falls on all alike): at least 3 rounds, about budget_s each."""
    for fn in calls.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    stop, rounds = time.perf_counter() + budget_s * len(calls), 0
    while rounds < 3 or (time.perf_counter() < stop and rounds < max_rounds):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
        rounds += 1
    return {name: float(np.median(t)) for name, t in times.items()}


def conditioned_stages(runtime: Runtime, shapes: list[tuple[int, ...]], budget_s: float) -> list[dict[str, Any]]:
    """Per shape: the median ms of the whole conditioned call and of each of its stages, and the rest."""
    model = runtime.get("layernorm")
    assert isinstance(model, LayerNormModel)
    rows = []
    for shape in shapes:
        x = sample(shape)
        calls, chunks = _stage_calls(model, x)
        stages = interleaved({WHOLE: lambda: model.infer(NormalizeInput(x, 1)), **calls}, budget_s)  # noqa: B023
        whole = stages.pop(WHOLE)
        stages = {name: s * (chunks if name in PER_CHUNK else 1) for name, s in stages.items()}
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
