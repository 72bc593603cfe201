"""The float64 NumPy reference: the ground truth every served path is checked against.

Each function is one concept from the seeds, written as the equation reads.
Shapes: B batch, T sequence, C d_model, H heads, R rows, D normalized columns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

Array = np.ndarray
Weights = Mapping[str, Array]

# Masked attention scores are replaced (not offset) by this value, in every
# implementation alike: a fully padded row then attends uniformly instead of
# producing NaN, and float32 and float64 agree on it.
MASKED_SCORE = float(np.finfo(np.float32).min)


@dataclass(frozen=True)
class LayerNormResult:
    output: Array  # same shape as x
    mean: Array  # x.shape[:-k]
    var: Array  # x.shape[:-k], population variance


def layer_norm(
    x: Array,
    k: int = 1,
    eps: float = 1e-5,
    eps_mode: str = "var",
    gamma: Array | None = None,
    beta: Array | None = None,
) -> LayerNormResult:
    """Normalize x over its last k dims, in float64.

    eps_mode "var" (torch.nn.LayerNorm, ONNX):  y = (x - mean) / sqrt(var + eps)
    eps_mode "std" (seed 000):                  y = (x - mean) / (sqrt(var) + eps)
    out = gamma * y + beta, with gamma and beta of shape x.shape[-k:].
    """
    assert 1 <= k <= x.ndim, f"k={k} must be in 1..{x.ndim}"
    assert eps_mode in ("var", "std"), f"unknown eps_mode {eps_mode!r}"
    x = np.asarray(x, dtype=np.float64)
    axes = tuple(range(x.ndim - k, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)  # ..., 1 (k ones)
    xshift = x - mean  # ..., D
    var = (xshift**2).mean(axis=axes, keepdims=True)  # population variance: no bias correction
    norm = xshift / denominator(var, eps, eps_mode)  # ..., D
    gamma64 = np.ones(x.shape[-k:]) if gamma is None else np.asarray(gamma, dtype=np.float64)
    beta64 = np.zeros(x.shape[-k:]) if beta is None else np.asarray(beta, dtype=np.float64)
    out = gamma64 * norm + beta64  # ..., D
    return LayerNormResult(out, mean.reshape(x.shape[:-k]), var.reshape(x.shape[:-k]))


def denominator(var: Array, eps: float, eps_mode: str) -> Array:
    """What a row's centered values are divided by: sqrt(var + eps) (mode var) or sqrt(var) + eps (mode std)."""
    den: Array = np.sqrt(var + eps) if eps_mode == "var" else np.sqrt(var) + eps
    return den


def positional_encoding(max_sequence_length: int, d_model: int) -> Array:
    """Sinusoidal table laid out as in seed 002: sin and cos interleaved per frequency."""
    even_i = np.arange(0, d_model, 2, dtype=np.float64)  # C/2
    denominator = np.power(10000.0, even_i / d_model)  # C/2
    position = np.arange(max_sequence_length, dtype=np.float64)[:, None]  # T,1
    even_pe = np.sin(position / denominator)  # T,C/2
    odd_pe = np.cos(position / denominator)  # T,C/2
    return np.stack([even_pe, odd_pe], axis=2).reshape(max_sequence_length, d_model)  # T,C


def linear(x: Array, weight: Array, bias: Array | None) -> Array:
    """x @ W.T + b, with W laid out (out_features, in_features) as torch.nn.Linear; no b for bias=False."""
    out: Array = x @ weight.T
    return out if bias is None else out + bias


def gelu(x: Array) -> Array:
    """GELU, the exact form: x * Phi(x), Phi the standard normal CDF (torch's approximate="none")."""
    erf = np.vectorize(math.erf, otypes=[np.float64])  # NumPy has no erf; math.erf is exact in float64
    out: Array = 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    return out


def gelu_tanh(x: Array) -> Array:
    """GELU, the tanh form (torch's approximate="tanh")."""
    out: Array = 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return out


ACTIVATIONS = {"relu": lambda x: np.maximum(x, 0.0), "gelu": gelu, "gelu_tanh": gelu_tanh}
POSITIONAL_ENCODINGS = ("none", "sinusoidal")


def softmax(scores: Array) -> Array:
    """Softmax over the last axis, shifted by the row max so exp cannot overflow."""
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    out: Array = e / e.sum(axis=-1, keepdims=True)
    return out


def multi_head_attention(x: Array, w: Weights, prefix: str, num_heads: int, padding_mask: Array | None) -> Array:
    """Scaled dot-product self-attention; padding_mask (B,T) is true where a key is padding."""
    B, T, C = x.shape
    hs = C // num_heads
    qkv = linear(x, w[f"{prefix}.qkv.weight"], w.get(f"{prefix}.qkv.bias"))  # B,T,3C
    q, k, v = np.split(qkv, 3, axis=-1)  # B,T,C each
    q = q.reshape(B, T, num_heads, hs).transpose(0, 2, 1, 3)  # B,H,T,hs
    k = k.reshape(B, T, num_heads, hs).transpose(0, 2, 1, 3)  # B,H,T,hs
    v = v.reshape(B, T, num_heads, hs).transpose(0, 2, 1, 3)  # B,H,T,hs
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hs)  # B,H,T,T
    if padding_mask is not None:
        scores = np.where(padding_mask[:, None, None, :], MASKED_SCORE, scores)  # B,H,T,T
    y = softmax(scores) @ v  # B,H,T,hs
    y = y.transpose(0, 2, 1, 3).reshape(B, T, C)  # B,T,C
    return linear(y, w[f"{prefix}.proj.weight"], w.get(f"{prefix}.proj.bias"))  # B,T,C


def feed_forward(x: Array, w: Weights, prefix: str, activation: str = "relu") -> Array:
    """Position-wise Linear -> activation (relu, gelu or gelu_tanh) -> Linear."""
    h = ACTIVATIONS[activation](linear(x, w[f"{prefix}.fc1.weight"], w.get(f"{prefix}.fc1.bias")))  # B,T,F
    return linear(h, w[f"{prefix}.fc2.weight"], w.get(f"{prefix}.fc2.bias"))  # B,T,C


@dataclass(frozen=True)
class EncoderConfig:
    d_model: int = 128
    num_heads: int = 8
    d_ff: int = 512
    num_layers: int = 2
    max_sequence_length: int = 512
    norm_first: bool = False  # False: post-LN as in the original paper; True: pre-LN (seed 004)
    eps: float = 1e-5  # of every LayerNorm in the layers
    activation: str = "relu"  # of the feed-forward: relu, gelu (erf form) or gelu_tanh
    # Defaults that keep the manifests written before these fields meaning what they meant: normserve's own
    # encoders add the seeds' sinusoidal encoding and end with a final norm exactly when pre-LN.
    positional_encoding: str = "sinusoidal"  # or "none": PyTorch's modules add none
    bias: bool = True  # the layers' Linear and LayerNorm biases (TransformerEncoderLayer's bias=)
    final_norm: bool | None = None  # a LayerNorm after the stack; None: when norm_first
    final_eps: float | None = None  # the final norm's eps; None: eps

    @property
    def has_final_norm(self) -> bool:
        return self.norm_first if self.final_norm is None else self.final_norm


LayerNormStats = list[tuple[str, Array, Array]]  # (name, mean (B,T), std (B,T))


def _norm(x: Array, w: Weights, name: str, eps: float, stats: LayerNormStats) -> Array:
    """A LayerNorm whose weight or bias is absent from w (elementwise_affine=False, bias=False) leaves it out."""
    r = layer_norm(x, 1, eps, "var", w.get(f"{name}.weight"), w.get(f"{name}.bias"))
    stats.append((name, r.mean, np.sqrt(r.var)))
    return r.output


def encoder_layer(
    x: Array, w: Weights, i: int, cfg: EncoderConfig, padding_mask: Array | None, stats: LayerNormStats
) -> Array:
    """One encoder layer: post-LN x = norm(x + sublayer(x)), or pre-LN x = x + sublayer(norm(x))."""
    p = f"layers.{i}"
    if cfg.norm_first:
        x = x + multi_head_attention(
            _norm(x, w, f"{p}.norm1", cfg.eps, stats), w, f"{p}.attn", cfg.num_heads, padding_mask
        )
        x = x + feed_forward(_norm(x, w, f"{p}.norm2", cfg.eps, stats), w, f"{p}.ff", cfg.activation)
    else:
        x = _norm(
            x + multi_head_attention(x, w, f"{p}.attn", cfg.num_heads, padding_mask), w, f"{p}.norm1", cfg.eps, stats
        )
        x = _norm(x + feed_forward(x, w, f"{p}.ff", cfg.activation), w, f"{p}.norm2", cfg.eps, stats)
    return x


def encoder(
    x: Array, w: Weights, cfg: EncoderConfig, padding_mask: Array | None = None
) -> tuple[Array, LayerNormStats]:
    """Positional encoding (if any), then the layer stack, then the final norm (if any).

    x is (B,T,C); returns the output (B,T,C) and each LayerNorm's input statistics in execution order.
    """
    x = np.asarray(x, dtype=np.float64)
    B, T, C = x.shape
    assert C == cfg.d_model, f"last dim {C} != d_model {cfg.d_model}"
    assert T <= cfg.max_sequence_length, f"sequence {T} > max_sequence_length {cfg.max_sequence_length}"
    stats: LayerNormStats = []
    if cfg.positional_encoding == "sinusoidal":
        x = x + positional_encoding(T, C)[None]  # B,T,C
    for i in range(cfg.num_layers):
        x = encoder_layer(x, w, i, cfg, padding_mask, stats)
    if cfg.has_final_norm:
        x = _norm(x, w, "norm", cfg.eps if cfg.final_eps is None else cfg.final_eps, stats)
    return x, stats


def layer_norm_names(cfg: EncoderConfig) -> list[str]:
    """The LayerNorms of an encoder in execution order, as named in weights and outputs."""
    names = [f"layers.{i}.norm{j}" for i in range(cfg.num_layers) for j in (1, 2)]
    return names + (["norm"] if cfg.has_final_norm else [])
