"""Medians, in one process, of torch's layer_norm, a plain onnxruntime call, the old and the new /normalize path.

    python scripts/kernel_timing.py [--repeats 200] [--threads 1]

"old" is every row on the exact path (app.core.layernorm.LayerNormModel.exact_rows: conditioned rows through
the model's graph, refined), which is what /normalize ran before the fused kernel; "new" is LayerNormModel.infer.
"plain ORT" is one session.run of the model's graph on the raw rows, with nothing around it. The four are
timed in turn, round after round, so a noisy machine slows them alike; ratios are to torch, or to plain ORT
at (1, 8, 64).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file, the repository root is not on sys.path

from app.core.dataplane import NormalizeInput
from app.core.layernorm import LayerNormModel
from app.core.runtime import Runtime
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(1, 8, 64), (8, 128, 768), (32, 512, 1024)]
ROUNDS_DIVISOR = {(1, 8, 64): 1, (8, 128, 768): 4, (32, 512, 1024): 20}  # a few seconds at each shape


def old_path(model: LayerNormModel, req: NormalizeInput) -> np.ndarray:
    """Every row conditioned, in the chunks normalize_rows takes."""
    x2 = req.x.reshape(-1, req.cols)
    D = x2.shape[1]
    gamma, beta = np.ones(D, np.float32), np.zeros(D, np.float32)
    step = max(1, (1 << 18) // D)
    out = np.empty(x2.shape, np.float32)
    for i in range(0, len(x2), step):
        out[i : i + step] = model.exact_rows(x2[i : i + step], req, gamma, beta)[0]
    return out.reshape(req.x.shape)


def timings(model: LayerNormModel, shape: tuple[int, ...], repeats: int) -> dict[str, float]:
    import torch

    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    D = shape[-1]
    x2, xt = x.reshape(-1, D), torch.from_numpy(x)
    ones, zeros = np.ones((len(x2), 1), np.float32), np.zeros((len(x2), 1), np.float32)
    feeds = {"input": x2, "gamma": ones[0].repeat(D), "beta": zeros[0].repeat(D), "eps_var": ones * 1e-5}
    feeds["eps_std"] = zeros
    runs: dict[str, Callable[[], object]] = {
        "torch": lambda: torch.nn.functional.layer_norm(xt, (D,), eps=1e-5),
        "plain ORT": lambda: model.session.run(None, feeds),
        "old": lambda: old_path(model, NormalizeInput(x, 1)),
        "new": lambda: model.infer(NormalizeInput(x, 1)),
    }
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) * 1e3 for name, s in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="rounds at (1,8,64); fewer at larger shapes")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of torch and onnxruntime")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    runtime = Runtime(Settings(model_dir=ROOT / "models", intra_op_threads=args.threads))
    model = runtime.build("layernorm", 1)
    assert isinstance(model, LayerNormModel)
    print(f"threads {args.threads}, cpus {os.cpu_count()}; medians in ms")
    print(f"{'shape':>16} {'torch':>8} {'plain ORT':>10} {'old':>8} {'new':>8}  old/ref  new/ref (ref)")
    for shape in SHAPES:
        t = timings(model, shape, max(5, args.repeats // ROUNDS_DIVISOR[shape]))
        ref = "plain ORT" if shape == SHAPES[0] else "torch"
        print(
            f"{shape!s:>16} {t['torch']:8.3f} {t['plain ORT']:10.3f} {t['old']:8.3f} {t['new']:8.3f}"
            f"  {t['old'] / t[ref]:6.1f}x  {t['new'] / t[ref]:6.2f}x ({ref})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
