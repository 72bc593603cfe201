"""Fixed, seeded parity inputs, and how far ONNX Runtime lands from PyTorch and from the NumPy reference."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
import torch

from app.core.reference import encoder, layer_norm
from app.export.modules import Encoder, RowLayerNorm

Forward = Callable[[np.ndarray, np.ndarray | None], np.ndarray]  # the user's module on the served layout

PARITY_SEED = 20240613  # fixed, and separate from the weight seed, so figures compare across exports
LAYERNORM_DESCRIPTION = (
    "seeded N(0,1) float32 with random gamma/beta for k=1..3 reshaped to 2-D, both eps modes; "
    "per-row eps 1e-5..1; golden vectors seed003-var ([2,1,3] k=2 and [2,3]) and seed000-std (eps 1e-6)"
)


@dataclass(frozen=True)
class LayerNormCase:
    id: str
    x: np.ndarray  # float32, any rank
    k: int  # normalized over the last k dims
    eps: float | tuple[float, ...]  # one eps, or one per row of the 2-D view
    eps_mode: str
    gamma: np.ndarray | None = None  # x.shape[-k:]
    beta: np.ndarray | None = None  # x.shape[-k:]


def layernorm_cases() -> list[LayerNormCase]:
    """The layernorm parity inputs: golden vectors, random k=1..3 in both eps modes, per-row eps."""
    rng = np.random.default_rng(PARITY_SEED)
    seed003 = np.array([[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]], dtype=np.float32)
    seed000 = np.array([[0.2, 0.8, 1.0, 1.2], [1.0, 0.0, 0.5, 1.5]], dtype=np.float32)
    cases = [
        LayerNormCase("seed003-var-k2", seed003.reshape(2, 1, 3), 2, 1e-5, "var"),
        LayerNormCase("seed003-var", seed003, 1, 1e-5, "var"),
        LayerNormCase("seed000-std", seed000, 1, 1e-6, "std"),
    ]
    for k, shape in ((1, (5, 16)), (2, (3, 4, 8)), (3, (2, 3, 4, 5))):
        for mode in ("var", "std"):
            x = rng.standard_normal(shape).astype(np.float32)
            gamma = (1.0 + 0.5 * rng.standard_normal(shape[-k:])).astype(np.float32)
            beta = rng.standard_normal(shape[-k:]).astype(np.float32)
            cases.append(LayerNormCase(f"k{k}-{mode}", x, k, 1e-5, mode, gamma, beta))
    x = rng.standard_normal((4, 16)).astype(np.float32)
    cases.append(LayerNormCase("per-row-eps", x, 1, (1e-5, 1e-3, 1e-1, 1.0), "var"))
    return cases


def layernorm_feeds(case: LayerNormCase) -> dict[str, np.ndarray]:
    """The 2-D view and per-row eps inputs of models/layernorm.onnx, as the server builds them."""
    shape = case.x.shape
    rows, cols = math.prod(shape[: -case.k]), math.prod(shape[-case.k :])
    eps = np.array(np.broadcast_to(np.asarray(case.eps, dtype=np.float32), (rows,))).reshape(rows, 1)  # a writable copy
    zero = np.zeros((rows, 1), dtype=np.float32)
    ones, zeros = np.ones(cols, dtype=np.float32), np.zeros(cols, dtype=np.float32)
    return {
        "input": case.x.reshape(rows, cols),
        "gamma": ones if case.gamma is None else case.gamma.reshape(cols),
        "beta": zeros if case.beta is None else case.beta.reshape(cols),
        "eps_var": eps if case.eps_mode == "var" else zero,
        "eps_std": zero if case.eps_mode == "var" else eps,
    }


def layernorm_reference(case: LayerNormCase, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """output (R,D), mean (R,1), inv_std_dev (R,1) in float64 from app.reference on the N-D input."""
    rows, cols = feeds["input"].shape
    if isinstance(case.eps, tuple):  # the reference takes one eps: normalize row by row
        parts = [layer_norm(feeds["input"][i : i + 1], 1, e, case.eps_mode) for i, e in enumerate(case.eps)]
        out = np.concatenate([p.output for p in parts]) * feeds["gamma"] + feeds["beta"]
        mean, var = np.concatenate([p.mean for p in parts]), np.concatenate([p.var for p in parts])
    else:
        r = layer_norm(case.x, case.k, case.eps, case.eps_mode, case.gamma, case.beta)
        out, mean, var = r.output, r.mean, r.var
    eps_var, eps_std = feeds["eps_var"].astype(np.float64), feeds["eps_std"].astype(np.float64)
    inv_std_dev = 1.0 / (np.sqrt(var.reshape(rows, 1) + eps_var) + eps_std)  # R,1
    return [out.reshape(rows, cols), mean.reshape(rows, 1), inv_std_dev]


def layernorm_parity(session: ort.InferenceSession, module: RowLayerNorm) -> tuple[float, float, str]:
    """Max abs difference of ORT vs torch and ORT vs the reference over every output of every case."""
    vs_torch, vs_numpy = [], []
    for case in layernorm_cases():
        feeds = layernorm_feeds(case)
        got = session.run(None, feeds)
        with torch.no_grad():
            expected = [t.numpy() for t in module(*(torch.from_numpy(v) for v in feeds.values()))]
        vs_torch.append(max_abs_diff(got, expected))
        vs_numpy.append(max_abs_diff(got, layernorm_reference(case, feeds)))
    return _worst(vs_torch), _worst(vs_numpy), LAYERNORM_DESCRIPTION


def learned_layernorm_parity(
    session: ort.InferenceSession, module: torch.nn.LayerNorm, gamma: np.ndarray, beta: np.ndarray
) -> tuple[float, float, str]:
    """A trained nn.LayerNorm: the graph fed its gamma, beta and eps as the server feeds them, vs the module.

    torch gives the output only: the graph's mean and inv_std_dev are checked against the reference.
    """
    shape, k, eps = gamma.shape, gamma.ndim, float(module.eps)
    vs_torch, vs_numpy = [], []
    for batch, x in learned_layernorm_inputs(shape).items():
        case = LayerNormCase(f"learned-{len(batch)}", x, k, eps, "var", gamma, beta)
        feeds = layernorm_feeds(case)
        got = session.run(None, feeds)
        with torch.no_grad():
            expected = module(torch.from_numpy(x)).numpy().reshape(got[0].shape)
        vs_torch.append(max_abs_diff(got[:1], [expected]))
        vs_numpy.append(max_abs_diff(got, layernorm_reference(case, feeds)))
    dims = ",".join(map(str, shape))
    description = (
        f"the LayerNorm's gamma and beta (1 and 0 where it has none) and eps {eps:g} (eps_mode var); "
        f"seeded N(0,1) float32 scaled by 1, 10 and 0.1: [5,{dims}], [2,3,{dims}], [1,{dims}]; "
        "the torch.nn.LayerNorm module for the output"
    )
    return _worst(vs_torch), _worst(vs_numpy), description


def learned_layernorm_inputs(shape: tuple[int, ...]) -> dict[tuple[int, ...], np.ndarray]:
    """Seeded N(0,1) float32 inputs of a trained LayerNorm's shape by batch: scaled by 1, 10 and 0.1 in turn."""
    rng = np.random.default_rng(PARITY_SEED)
    scales = {(5,): 1.0, (2, 3): 10.0, (1,): 0.1}
    return {b: (s * rng.standard_normal((*b, *shape))).astype(np.float32) for b, s in scales.items()}


def encoder_cases(d_model: int, max_sequence_length: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(input (B,T,C) float32, padding_mask (B,T) bool) pairs: a fully padded row, T=1, and T=max."""
    rng = np.random.default_rng(PARITY_SEED)
    T, L = min(7, max_sequence_length), max_sequence_length
    mask = np.zeros((3, T), dtype=bool)
    mask[1, T // 2 + 1 :] = True
    mask[2] = True  # a fully padded row attends uniformly: finite, never NaN
    long_mask = np.zeros((2, L), dtype=bool)
    long_mask[1, L // 2 :] = True
    shapes_masks = [
        ((3, T, d_model), mask),
        ((1, 1, d_model), np.zeros((1, 1), dtype=bool)),
        ((2, L, d_model), long_mask),
    ]
    return [(rng.standard_normal(shape).astype(np.float32), m) for shape, m in shapes_masks]


def encoder_parity(
    session: ort.InferenceSession, model: Encoder, weights: dict[str, np.ndarray], against: Forward | None = None
) -> tuple[float, float, str]:
    """Max abs difference of ORT vs torch and ORT vs the reference (float64 on the float32 weights).

    torch is the user's own module when given (`against`: its output, at unpadded positions, with the cases'
    masks and with none), else normserve's Encoder built from the state_dict (every output).
    """
    cfg = model.cfg
    vs_torch, vs_numpy = [], []
    for x, mask in encoder_cases(cfg.d_model, cfg.max_sequence_length):
        got = session.run(None, {"input": x, "padding_mask": mask})
        if against is not None:
            vs_torch.append(_unpadded_diff(got[0], against(x, mask), mask))
            plain = session.run(["output"], {"input": x, "padding_mask": np.zeros_like(mask)})[0]
            vs_torch.append(_unpadded_diff(plain, against(x, None), None))
        else:
            with torch.no_grad():
                expected = [t.numpy() for t in model(torch.from_numpy(x), torch.from_numpy(mask))]
            vs_torch.append(max_abs_diff(got, expected))
        out, stats = encoder(x, weights, cfg, mask)
        reference = [out] + [a for _, mean, std in stats for a in (mean, std)]
        vs_numpy.append(max_abs_diff(got, reference))
    T, L = min(7, cfg.max_sequence_length), cfg.max_sequence_length
    description = (
        f"seeded N(0,1) float32: [3,{T},{cfg.d_model}] with row 1 padded from {T // 2 + 1} and row 2 "
        f"fully padded; [1,1,{cfg.d_model}]; [2,{L},{cfg.d_model}] with row 1 padded from {L // 2}; "
        + (
            "torch: the module itself in eval mode at unpadded positions, with these masks and with none"
            if against is not None
            else "torch: normserve's encoder built from the state_dict"
        )
    )
    return _worst(vs_torch), _worst(vs_numpy), description


def _unpadded_diff(got: np.ndarray, expected: np.ndarray, mask: np.ndarray | None) -> float:
    """Max abs difference at the positions the mask keeps: torch's fast path answers 0 at padded ones."""
    keep = np.ones(got.shape[:2], dtype=bool) if mask is None else ~mask  # B,T
    if not keep.any():
        return 0.0
    return float(np.max(np.abs(got[keep].astype(np.float64) - expected[keep])))


def max_abs_diff(got: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> float:
    """Largest |got - expected| over paired arrays, in float64; NaN if any value is NaN."""
    assert len(got) == len(expected), f"{len(got)} outputs != {len(expected)} expected"
    pairs = zip(got, expected, strict=True)
    return _worst([float(np.max(np.abs(np.asarray(g, dtype=np.float64) - e))) for g, e in pairs])


def _worst(diffs: list[float]) -> float:
    return float(np.max(diffs))  # np.max, not max(): NaN must win, not be skipped by a comparison
