"""The NumPy reference: the invariants of the math (the seeds' golden vectors are checked in test_seeds.py)."""

from __future__ import annotations

import numpy as np
import pytest

from app.core import reference


def test_variance_has_no_bias_correction() -> None:
    x = np.array([1.0, 2.0, 3.0, 4.0])
    assert reference.layer_norm(x).var == pytest.approx(np.var(x, ddof=0))
    assert reference.layer_norm(x).var != pytest.approx(np.var(x, ddof=1))


@pytest.mark.parametrize("eps_mode", ["var", "std"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_output_has_mean_beta_and_std_gamma(eps_mode: str, k: int) -> None:
    rng = np.random.default_rng(k)
    x = rng.standard_normal((2, 3, 4, 5)) * 3 + 7
    gamma = rng.uniform(0.5, 2, x.shape[-k:])
    beta = rng.standard_normal(x.shape[-k:])
    y = reference.layer_norm(x, k, 1e-9, eps_mode).output
    axes = tuple(range(4 - k, 4))
    np.testing.assert_allclose(y.mean(axis=axes), 0, atol=1e-9)
    np.testing.assert_allclose(y.var(axis=axes), 1, atol=1e-6)
    out = reference.layer_norm(x, k, 1e-9, eps_mode, gamma, beta).output
    np.testing.assert_allclose(out, gamma * y + beta, atol=1e-12)


@pytest.mark.parametrize("eps_mode", ["var", "std"])
def test_shift_and_positive_scale_invariance(eps_mode: str) -> None:
    x = np.random.default_rng(0).standard_normal((4, 16))
    base = reference.layer_norm(x, 1, 1e-5, eps_mode).output
    shifted = reference.layer_norm(x + 1e3, 1, 1e-5, eps_mode).output
    # scaling by a needs eps / a**2 (var mode) or eps / a (std mode) to stay exact
    a = 8.0
    scaled = reference.layer_norm(x * a, 1, 1e-5 * (a**2 if eps_mode == "var" else a), eps_mode).output
    np.testing.assert_allclose(shifted, base, atol=1e-10)
    np.testing.assert_allclose(scaled, base, atol=1e-12)


def test_constant_row_normalizes_to_beta() -> None:
    r = reference.layer_norm(np.full((2, 5), 3.0), beta=np.arange(5.0))
    np.testing.assert_array_equal(r.output, np.tile(np.arange(5.0), (2, 1)))
    np.testing.assert_array_equal(r.var, 0)


def test_positional_encoding_interleaves_sin_and_cos() -> None:
    pe = reference.positional_encoding(10, 6)
    assert pe.shape == (10, 6)
    np.testing.assert_allclose(pe[0], [0, 1, 0, 1, 0, 1])
    np.testing.assert_allclose(pe[1], [0.8415, 0.5403, 0.0464, 0.9989, 0.0022, 1.0000], atol=1e-4)
    np.testing.assert_allclose(pe[9], [0.4121, -0.9111, 0.4057, 0.9140, 0.0194, 0.9998], atol=1e-4)


def _weights(cfg: reference.EncoderConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    C, F = cfg.d_model, cfg.d_ff
    shapes = {"attn.qkv": (3 * C, C), "attn.proj": (C, C), "ff.fc1": (F, C), "ff.fc2": (C, F)}
    w: dict[str, np.ndarray] = {}
    for i in range(cfg.num_layers):
        for name, (o, n) in shapes.items():
            w[f"layers.{i}.{name}.weight"] = rng.standard_normal((o, n)) / np.sqrt(n)
            w[f"layers.{i}.{name}.bias"] = 0.1 * rng.standard_normal(o)
    for name in reference.layer_norm_names(cfg):
        w[f"{name}.weight"] = 1 + 0.1 * rng.standard_normal(C)
        w[f"{name}.bias"] = 0.1 * rng.standard_normal(C)
    return w


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-ln", "pre-ln"])
def test_encoder_reports_one_stat_per_layer_norm_in_order(norm_first: bool) -> None:
    cfg = reference.EncoderConfig(d_model=16, num_heads=4, d_ff=32, num_layers=2, norm_first=norm_first)
    x = np.random.default_rng(1).standard_normal((2, 5, 16))
    out, stats = reference.encoder(x, _weights(cfg), cfg)
    assert out.shape == x.shape
    assert [s[0] for s in stats] == reference.layer_norm_names(cfg)
    assert all(m.shape == (2, 5) and s.shape == (2, 5) for _, m, s in stats)
    # the first LayerNorm of a pre-LN stack sees the input plus the positional encoding
    if norm_first:
        first_in = x + reference.positional_encoding(5, 16)
        np.testing.assert_allclose(stats[0][1], first_in.mean(-1))
        np.testing.assert_allclose(stats[0][2], first_in.std(-1))


def test_padding_mask_hides_keys_and_full_padding_stays_finite() -> None:
    cfg = reference.EncoderConfig(d_model=16, num_heads=4, d_ff=32, num_layers=1)
    w = _weights(cfg)
    x = np.random.default_rng(2).standard_normal((2, 4, 16))
    mask = np.array([[False, False, True, True], [True, True, True, True]])
    out, _ = reference.encoder(x, w, cfg, mask)
    assert np.isfinite(out).all()
    # changing a padded key's value must not change the unpadded positions of that sequence
    x2 = x.copy()
    x2[0, 3] += 100.0
    out2, _ = reference.encoder(x2, w, cfg, mask)
    np.testing.assert_allclose(out2[0, :2], out[0, :2], atol=1e-12)
