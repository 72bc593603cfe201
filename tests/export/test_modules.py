"""The PyTorch modules behind the export against torch's own layers, the NumPy reference and the seeds."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from app.core import reference
from app.core.reference import EncoderConfig
from app.core.seeds import (
    LAYER_NORM_EXAMPLES,
    SEED000,
    SEED002_POSITIONAL_ENCODING,
    SEED003,
    SEED003_LAST_TWO_DIMS,
    LayerNormExample,
)
from app.export.modules import Encoder, EncoderLayer, LayerNorm, RowLayerNorm, seeded_encoder

SMALL = EncoderConfig(d_model=16, num_heads=4, d_ff=32, num_layers=2, max_sequence_length=32)

ATOL = 1e-4  # float32 against the seeds' numbers (or their own precision, where coarser)

# Our parameter names -> torch.nn.TransformerEncoderLayer's.
TORCH_LAYER_NAMES = {
    "attn.qkv.weight": "self_attn.in_proj_weight",
    "attn.qkv.bias": "self_attn.in_proj_bias",
    "attn.proj.weight": "self_attn.out_proj.weight",
    "attn.proj.bias": "self_attn.out_proj.bias",
    "ff.fc1.weight": "linear1.weight",
    "ff.fc1.bias": "linear1.bias",
    "ff.fc2.weight": "linear2.weight",
    "ff.fc2.bias": "linear2.bias",
    "norm1.weight": "norm1.weight",
    "norm1.bias": "norm1.bias",
    "norm2.weight": "norm2.weight",
    "norm2.bias": "norm2.bias",
}


def _row_layer_norm(x: np.ndarray, k: int, eps: float, eps_mode: str, gamma: Any = None, beta: Any = None) -> Any:
    """RowLayerNorm on the 2-D view of x, as the server feeds models/layernorm.onnx."""
    rows, cols = math.prod(x.shape[:-k]), math.prod(x.shape[-k:])
    eps_col = torch.full((rows, 1), eps)
    zero = torch.zeros(rows, 1)
    g = torch.ones(cols) if gamma is None else torch.as_tensor(gamma, dtype=torch.float32).reshape(cols)
    b = torch.zeros(cols) if beta is None else torch.as_tensor(beta, dtype=torch.float32).reshape(cols)
    eps_var, eps_std = (eps_col, zero) if eps_mode == "var" else (zero, eps_col)
    x2 = torch.as_tensor(x, dtype=torch.float32).reshape(rows, cols)
    out, mean, inv_std_dev = RowLayerNorm()(x2, g, b, eps_var, eps_std)
    return out.reshape(x.shape).numpy(), mean.reshape(x.shape[:-k]).numpy(), inv_std_dev.reshape(x.shape[:-k]).numpy()


@pytest.mark.parametrize("k", [1, 2, 3])
def test_reference_matches_torch_layer_norm_module_and_functional(k: int) -> None:
    rng = np.random.default_rng(k)
    x = rng.standard_normal((2, 3, 4, 5)) * 2 + 3
    gamma, beta = rng.uniform(0.5, 2, x.shape[-k:]), rng.standard_normal(x.shape[-k:])
    expected = reference.layer_norm(x, k, 1e-5, "var", gamma, beta).output
    module = nn.LayerNorm(x.shape[-k:], eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(gamma))
        module.bias.copy_(torch.from_numpy(beta))
        by_module = module(torch.from_numpy(x)).numpy()
        by_functional = F.layer_norm(
            torch.from_numpy(x), x.shape[-k:], torch.from_numpy(gamma), torch.from_numpy(beta), 1e-5
        ).numpy()
    np.testing.assert_allclose(by_module, expected, atol=1e-12)
    np.testing.assert_allclose(by_functional, expected, atol=1e-12)


@pytest.mark.parametrize("eps_mode", ["var", "std"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_row_layer_norm_on_the_2d_view_matches_reference(k: int, eps_mode: str) -> None:
    rng = np.random.default_rng(10 + k)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    gamma, beta = rng.uniform(0.5, 2, x.shape[-k:]), rng.standard_normal(x.shape[-k:])
    r = reference.layer_norm(x, k, 1e-5, eps_mode, gamma, beta)
    out, mean, inv_std_dev = _row_layer_norm(x, k, 1e-5, eps_mode, gamma, beta)
    denom = np.sqrt(r.var + 1e-5) if eps_mode == "var" else np.sqrt(r.var) + 1e-5
    np.testing.assert_allclose(out, r.output, atol=1e-5)
    np.testing.assert_allclose(mean, r.mean, atol=1e-6)
    np.testing.assert_allclose(inv_std_dev, 1 / denom, atol=1e-5)


@pytest.mark.parametrize("example", LAYER_NORM_EXAMPLES, ids=lambda e: e.name)
def test_golden_vectors_hold_for_reference_and_torch_row_layer_norm(example: LayerNormExample) -> None:
    x = np.asarray(example.x, dtype=np.float32)
    k, eps, eps_mode = example.k, example.eps, example.eps_mode
    r = reference.layer_norm(x, k, eps, eps_mode)
    out, mean, _ = _row_layer_norm(x, k, eps, eps_mode)
    atol = max(ATOL, example.atol)
    for output in (r.output, out):
        np.testing.assert_allclose(output, example.output, atol=atol)
    np.testing.assert_allclose(mean, example.mean, atol=atol)
    np.testing.assert_allclose(np.sqrt(r.var), example.std, atol=atol)


@pytest.mark.parametrize("example", [e for e in LAYER_NORM_EXAMPLES if e.eps_mode == "var"], ids=lambda e: e.name)
def test_golden_vectors_hold_for_torch_nn_layer_norm(example: LayerNormExample) -> None:
    x = torch.tensor(np.asarray(example.x, dtype=np.float32))
    with torch.no_grad():
        out = nn.LayerNorm(list(example.normalized_shape), eps=example.eps)(x)
    np.testing.assert_allclose(out.numpy(), example.output, atol=max(ATOL, example.atol))


def test_export_parity_inputs_include_the_seeds_inputs() -> None:
    from app.export.parity import layernorm_cases

    cases = {c.id: c for c in layernorm_cases()}
    for case_id, example in (
        ("seed003-var", SEED003),
        ("seed003-var-k2", SEED003_LAST_TWO_DIMS),
        ("seed000-std", SEED000),
    ):
        case = cases[case_id]
        np.testing.assert_array_equal(case.x, np.asarray(example.x, dtype=np.float32))
        assert (case.k, case.eps, case.eps_mode) == (example.k, example.eps, example.eps_mode)


def test_encoder_layer_norm_matches_nn_layer_norm_and_reports_population_stats() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16) * 3 + 1
    ours, ref = LayerNorm(16, 1e-5), nn.LayerNorm(16, eps=1e-5)
    with torch.no_grad():
        for p, q in ((ours.weight, ref.weight), (ours.bias, ref.bias)):
            p.copy_(torch.randn(16))
            q.copy_(p)
        stats: list[tuple[torch.Tensor, torch.Tensor]] = []
        out = ours(x, stats)
        torch.testing.assert_close(out, ref(x), atol=1e-5, rtol=0)
    ((mean, std),) = stats
    torch.testing.assert_close(mean, x.mean(-1))
    torch.testing.assert_close(std, x.std(-1, correction=0))
    assert not torch.allclose(std, x.std(-1), atol=1e-3), "std must be the population std, not torch's default N-1"


def _torch_layer_like(layer: EncoderLayer, cfg: EncoderConfig) -> nn.TransformerEncoderLayer:
    twin = nn.TransformerEncoderLayer(
        cfg.d_model,
        cfg.num_heads,
        cfg.d_ff,
        dropout=0.0,
        activation="relu",
        layer_norm_eps=cfg.eps,
        batch_first=True,
        norm_first=cfg.norm_first,
    )
    twin.load_state_dict({TORCH_LAYER_NAMES[k]: v for k, v in layer.state_dict().items()}, strict=True)
    return twin.eval()


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "key-padding-mask"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_encoder_layer_matches_torch_transformer_encoder_layer(norm_first: bool, masked: bool) -> None:
    cfg = dataclasses.replace(SMALL, norm_first=norm_first)
    layer = seeded_encoder(cfg, seed=3).layers[0]
    assert isinstance(layer, EncoderLayer)
    twin = _torch_layer_like(layer, cfg)
    x = torch.randn(3, 6, cfg.d_model, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(3, 6, dtype=torch.bool)
    if masked:
        mask[1, 4:] = True  # no fully padded row: torch's -inf masking would give NaN there
        mask[2, 1:] = True
    with torch.no_grad():
        ours = layer(x, mask, [])
        theirs = twin(x, src_key_padding_mask=mask if masked else None)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_torch_encoder_matches_reference_with_padding_masks(norm_first: bool) -> None:
    cfg = dataclasses.replace(SMALL, norm_first=norm_first)
    model = seeded_encoder(cfg, seed=5)
    x = np.random.default_rng(0).standard_normal((3, 9, cfg.d_model)).astype(np.float32)
    mask = np.zeros((3, 9), dtype=bool)
    mask[1, 5:] = True
    mask[2] = True  # fully padded: uniform attention, finite
    with torch.no_grad():
        output, *stats = model(torch.from_numpy(x), torch.from_numpy(mask))
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    expected, expected_stats = reference.encoder(x, weights, cfg, mask)
    assert np.isfinite(output.numpy()).all()
    np.testing.assert_allclose(output.numpy(), expected, atol=1e-5)
    assert [name for name, _, _ in expected_stats] == reference.layer_norm_names(cfg)
    for (_, mean, std), ours_mean, ours_std in zip(expected_stats, stats[::2], stats[1::2], strict=True):
        np.testing.assert_allclose(ours_mean.numpy(), mean, atol=1e-5)
        np.testing.assert_allclose(ours_std.numpy(), std, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_encoder_state_dict_keys_and_shapes_are_the_reference_weight_names(norm_first: bool) -> None:
    cfg = dataclasses.replace(SMALL, norm_first=norm_first)
    C, F_ = cfg.d_model, cfg.d_ff
    per_layer = {
        "attn.qkv.weight": [3 * C, C],
        "attn.qkv.bias": [3 * C],
        "attn.proj.weight": [C, C],
        "attn.proj.bias": [C],
        "ff.fc1.weight": [F_, C],
        "ff.fc1.bias": [F_],
        "ff.fc2.weight": [C, F_],
        "ff.fc2.bias": [C],
        "norm1.weight": [C],
        "norm1.bias": [C],
        "norm2.weight": [C],
        "norm2.bias": [C],
    }
    expected = {f"layers.{i}.{k}": v for i in range(cfg.num_layers) for k, v in per_layer.items()}
    if norm_first:
        expected |= {"norm.weight": [C], "norm.bias": [C]}
    assert {k: list(v.shape) for k, v in Encoder(cfg).state_dict().items()} == expected


def test_seeded_encoder_is_deterministic_and_perturbs_layer_norms() -> None:
    a, b = seeded_encoder(SMALL, seed=7).state_dict(), seeded_encoder(SMALL, seed=7).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(
        a["layers.0.attn.qkv.weight"], seeded_encoder(SMALL, seed=8).state_dict()["layers.0.attn.qkv.weight"]
    )
    gamma, beta = a["layers.0.norm1.weight"], a["layers.0.norm1.bias"]
    assert 0.02 < float((gamma - 1).std()) < 0.3 and 0.02 < float(beta.std()) < 0.3


def test_positional_encoding_matches_seed_002_table() -> None:
    cfg = EncoderConfig(d_model=6, num_heads=2, d_ff=8, num_layers=1, max_sequence_length=10)
    pe = SEED002_POSITIONAL_ENCODING
    np.testing.assert_allclose(Encoder(cfg).pe.numpy(), pe.encoding, atol=ATOL)
    np.testing.assert_allclose(
        reference.positional_encoding(pe.max_sequence_length, pe.d_model), pe.encoding, atol=ATOL
    )
