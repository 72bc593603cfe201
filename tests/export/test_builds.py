"""app/export/builds.py: the architecture line an export prints, and the learned LayerNorm's weights as served."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from torch import nn

from app.core.reference import EncoderConfig
from app.export.builds import architecture, gamma_beta


@pytest.mark.parametrize(
    ("cfg", "source", "line"),
    [
        (
            EncoderConfig(),
            {"class": "normserve Encoder"},
            "normserve Encoder: 2 layers, d_model 128, 8 heads, d_ff 512, relu, post-LN, eps 1e-05, no final norm, "
            "bias, positional encoding sinusoidal",
        ),
        (
            EncoderConfig(
                d_model=32,
                d_ff=64,
                norm_first=True,
                eps=1e-6,
                activation="gelu",
                positional_encoding="none",
                bias=False,
                final_norm=True,
                final_eps=1e-5,
            ),
            {"class": "torch.nn.TransformerEncoder", "batch_first": False},
            "torch.nn.TransformerEncoder: 2 layers, d_model 32, 8 heads, d_ff 64, gelu, pre-LN, eps 1e-06, "
            "final norm (eps 1e-05), bias=False, positional encoding none, batch_first=False (served batch first)",
        ),
    ],
    ids=["default", "gelu-pre-ln-seq-first"],
)
def test_the_architecture_line_says_every_setting(cfg: EncoderConfig, source: dict[str, Any], line: str) -> None:
    assert architecture(cfg, source) == line


@pytest.mark.parametrize(
    ("module", "gamma", "beta"),
    [
        (nn.LayerNorm((2, 3), elementwise_affine=False), np.ones((2, 3)), np.zeros((2, 3))),
        (nn.LayerNorm(4, bias=False), np.ones(4), np.zeros(4)),
    ],
    ids=["affine-false", "bias-false"],
)
def test_a_layernorm_without_weights_serves_ones_and_zeros(
    module: nn.LayerNorm, gamma: np.ndarray, beta: np.ndarray
) -> None:
    got = gamma_beta(module)
    assert [(a.dtype, a.shape) for a in got] == [(np.float32, gamma.shape)] * 2
    np.testing.assert_array_equal(got[0], gamma)
    np.testing.assert_array_equal(got[1], beta)
