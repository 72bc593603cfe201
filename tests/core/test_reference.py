"""The NumPy reference: the invariants of the math (the seeds' golden vectors are checked in test_seeds.py)."""

from __future__ import annotations

import dataclasses

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


# torch.nn.functional.gelu in float64 at these points, both forms (approximate="none" and "tanh").
GELU_POINTS = [-3.0, -1.0, 0.5, 1.0, 2.5]
GELU_ERF = [-0.00404969409489031, -0.15865525393145702, 0.34573123063700656, 0.841344746068543, 2.4844758366855597]
GELU_TANH = [-0.0036373920817729943, -0.15880800939172324, 0.34571400982514394, 0.8411919906082768, 2.484915733910001]


@pytest.mark.parametrize(
    ("activation", "expected"), [("gelu", GELU_ERF), ("gelu_tanh", GELU_TANH)], ids=["erf", "tanh"]
)
def test_gelu_is_torchs_in_both_forms(activation: str, expected: list[float]) -> None:
    np.testing.assert_allclose(reference.ACTIVATIONS[activation](np.array(GELU_POINTS)), expected, rtol=1e-14)


def test_the_activation_of_the_config_is_the_feed_forwards() -> None:
    cfg = reference.EncoderConfig(d_model=8, num_heads=2, d_ff=16, num_layers=1)
    w, x = _weights(cfg), np.random.default_rng(3).standard_normal((1, 4, 8))
    h = reference.linear(x, w["layers.0.ff.fc1.weight"], w["layers.0.ff.fc1.bias"])
    expected = reference.linear(reference.gelu(h), w["layers.0.ff.fc2.weight"], w["layers.0.ff.fc2.bias"])
    np.testing.assert_allclose(reference.feed_forward(x, w, "layers.0.ff", "gelu"), expected)
    assert np.abs(reference.feed_forward(x, w, "layers.0.ff") - expected).max() > 1e-3, "relu is another answer"


def test_without_positional_encoding_the_first_norm_sees_the_input_itself() -> None:
    cfg = reference.EncoderConfig(d_model=16, num_heads=4, d_ff=32, num_layers=1, norm_first=True)
    x = np.random.default_rng(4).standard_normal((2, 5, 16))
    _, stats = reference.encoder(x, _weights(cfg), dataclasses.replace(cfg, positional_encoding="none"))
    np.testing.assert_allclose(stats[0][1], x.mean(-1))
    np.testing.assert_allclose(stats[0][2], x.std(-1))


@pytest.mark.parametrize("absent", ["bias", "weight"], ids=["bias-false", "affine-false"])
def test_weights_absent_from_the_state_are_left_out(absent: str) -> None:
    """bias=False drops every bias, elementwise_affine=False a norm's weight and bias: as zeros and ones."""
    cfg = reference.EncoderConfig(d_model=16, num_heads=4, d_ff=32, num_layers=1)
    w = _weights(cfg)
    dropped = {k: v for k, v in w.items() if not k.endswith(absent if absent == "bias" else "norm1.weight")}
    if absent == "weight":
        dropped.pop("layers.0.norm1.bias")
        neutral = {"layers.0.norm1.weight": np.ones(16), "layers.0.norm1.bias": np.zeros(16)}
    else:
        neutral = {k: np.zeros_like(v) for k, v in w.items() if k.endswith("bias")}
    x = np.random.default_rng(5).standard_normal((2, 3, 16))
    np.testing.assert_allclose(reference.encoder(x, dropped, cfg)[0], reference.encoder(x, {**w, **neutral}, cfg)[0])


@pytest.mark.parametrize(
    ("norm_first", "final_norm", "last"),
    [(True, False, "layers.1.norm2"), (False, True, "norm"), (True, None, "norm"), (False, None, "layers.1.norm2")],
    ids=["pre-ln-without", "post-ln-with", "pre-ln-default", "post-ln-default"],
)
def test_a_final_norm_is_where_the_config_says(norm_first: bool, final_norm: bool | None, last: str) -> None:
    cfg = reference.EncoderConfig(norm_first=norm_first, final_norm=final_norm)
    assert reference.layer_norm_names(cfg)[-1] == last
