"""The float64 NumPy reference of the BERT family: BERT, RoBERTa, XLM-RoBERTa and DistilBERT, as Hugging Face runs them.

The ground truth a text encoder's graph is checked against, at export (app/export/), at load (the warm-up) and by
`normserve validate`. Each function is one concept, written as the equation reads, on the float32 weights of the
version folder (weights.npz: the base model's state_dict, keys without the base-model prefix) widened to float64.
Shapes: B batch, T tokens, C hidden_size, H heads, hs head size, F intermediate_size, V vocab.

Every layer is post-LN (x = LayerNorm(x + sublayer(x))), as in the original BERT. The architectures differ only in
their names, their position ids and their token types:
- bert:                positions 0..T-1, token types from token_type_ids (0 when none are given);
- roberta/xlm-roberta: positions count the non-padding tokens after the padding index (HF's
                       create_position_ids_from_input_ids), a single token type;
- distilbert:          positions 0..T-1, no token types, its own parameter names.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.core.reference import gelu, gelu_tanh, layer_norm, linear, softmax

Array = np.ndarray
Weights = Mapping[str, Array]

MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert")
POOLINGS = ("mean", "cls", "none")


# Hugging Face's names (transformers.activations.ACT2FN) for the activations the family uses.
def relu(x: Array) -> Array:
    out: Array = np.maximum(x, 0.0)
    return out


def silu(x: Array) -> Array:
    """x * sigmoid(x)."""
    out: Array = x / (1.0 + np.exp(-x))
    return out


ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "gelu": gelu,  # the erf form
    "gelu_new": gelu_tanh,  # the tanh approximation, as GPT-2 wrote it
    "gelu_pytorch_tanh": gelu_tanh,
    "relu": relu,
    "silu": silu,
    "swish": silu,
}
# HF adds (1 - mask) * finfo(float32).min to the scores of padding keys: after the softmax they weigh exactly 0.
MASKED_OFFSET = float(np.finfo(np.float32).min)
# Mean pooling divides by the count of real tokens clamped to this, as sentence-transformers' Pooling does.
MIN_TOKEN_COUNT = 1e-9
# torch.nn.functional.normalize's eps (sentence-transformers' Normalize): a zero vector stays zero.
NORM_EPS = 1e-12


@dataclass(frozen=True)
class TextConfig:
    """The architecture (manifest["config"], HF's config.json with DistilBERT's fields renamed) and the head."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int  # 0: no token type embeddings (distilbert)
    pad_token_id: int
    position_offset: int  # roberta/xlm-roberta: pad_token_id + 1, the first real token's position; else 0
    sinusoidal_pos_embds: bool = False  # distilbert: the table is in the weights either way
    pooling: str = "mean"
    normalize: bool = False
    max_seq_length: int = 0  # 0: as long as the position table allows

    def __post_init__(self) -> None:
        if self.max_seq_length == 0:
            object.__setattr__(self, "max_seq_length", self.max_position_embeddings - self.position_offset)
        checks = (
            (self.model_type in MODEL_TYPES, f"config.model_type {self.model_type!r}; expected one of {MODEL_TYPES}"),
            (
                self.hidden_act in ACTIVATIONS,
                f"config.hidden_act {self.hidden_act!r}; expected one of {tuple(ACTIVATIONS)}",
            ),
            (self.pooling in POOLINGS, f"pooling {self.pooling!r}; expected one of {POOLINGS}"),
            (
                self.hidden_size % self.num_attention_heads == 0,
                f"config.num_attention_heads {self.num_attention_heads} does not divide config.hidden_size "
                f"{self.hidden_size}",
            ),
            (
                self.pad_token_id < self.vocab_size,
                f"config.pad_token_id {self.pad_token_id} is outside the vocabulary (config.vocab_size "
                f"{self.vocab_size})",
            ),
            (
                self.max_seq_length + self.position_offset <= self.max_position_embeddings,
                f"max_seq_length {self.max_seq_length} + config.position_offset {self.position_offset} is past "
                f"config.max_position_embeddings {self.max_position_embeddings}",
            ),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def has_token_types(self) -> bool:
        """Whether the graph takes token_type_ids: BERT alone (RoBERTa's single type is always 0)."""
        return self.model_type == "bert"

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> TextConfig:
        """manifest["config"] plus pooling, normalize and max_seq_length; ValueError naming a missing or bad field."""
        raw = manifest.get("config")
        if not isinstance(raw, Mapping):
            raise ValueError(f"config {raw!r}; expected an object")
        sizes: tuple[str, ...] = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
        sizes += ("intermediate_size", "max_position_embeddings")
        indices = ("type_vocab_size", "pad_token_id", "position_offset")  # may be 0
        for key in sizes + indices:
            value, least = raw.get(key), 0 if key in indices else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(
                    f"config.{key} {value!r}; expected a {'non-negative' if least == 0 else 'positive'} integer"
                )
        eps = raw.get("layer_norm_eps")
        if not isinstance(eps, int | float) or isinstance(eps, bool) or not 0 < eps < math.inf:
            raise ValueError(f"config.layer_norm_eps {eps!r}; expected a positive finite number")
        max_seq_length = manifest.get("max_seq_length")
        if not isinstance(max_seq_length, int) or isinstance(max_seq_length, bool) or max_seq_length < 1:
            raise ValueError(f"max_seq_length {max_seq_length!r}; expected a positive integer")
        for key, value in (
            ("config.sinusoidal_pos_embds", raw.get("sinusoidal_pos_embds", False)),
            ("normalize", manifest.get("normalize")),
        ):
            if not isinstance(value, bool):
                raise ValueError(f"{key} {value!r}; expected true or false")
        return cls(
            model_type=str(raw.get("model_type")),
            hidden_act=str(raw.get("hidden_act")),
            layer_norm_eps=float(eps),
            sinusoidal_pos_embds=bool(raw.get("sinusoidal_pos_embds", False)),
            pooling=str(manifest.get("pooling")),
            normalize=bool(manifest["normalize"]),
            max_seq_length=max_seq_length,
            **{key: int(raw[key]) for key in sizes + indices},
        )


@dataclass
class TextOutputs:
    last_hidden_state: Array  # B,T,C
    sentence_embedding: Array  # B,C, normalized when config.normalize
    layer_norms: dict[str, tuple[Array, Array]] = field(default_factory=dict)  # name -> (mean B,T, std B,T)


def layer_norm_names(config: TextConfig) -> list[str]:
    """The LayerNorms in execution order, named as in the weights and the graph's outputs."""
    if config.model_type == "distilbert":
        per_layer = [
            f"transformer.layer.{i}.{n}"
            for i in range(config.num_hidden_layers)
            for n in ("sa_layer_norm", "output_layer_norm")
        ]
    else:
        per_layer = [
            f"encoder.layer.{i}.{n}"
            for i in range(config.num_hidden_layers)
            for n in ("attention.output.LayerNorm", "output.LayerNorm")
        ]
    return ["embeddings.LayerNorm", *per_layer]


def position_ids(input_ids: Array, config: TextConfig) -> Array:
    """0..T-1; or, with a position offset (RoBERTa), real tokens counted from the offset and padding at pad_token_id.

    RoBERTa tells padding by the pad token, not by the attention mask (create_position_ids_from_input_ids).
    """
    B, T = input_ids.shape
    if config.position_offset == 0:
        return np.broadcast_to(np.arange(T), (B, T)).copy()  # B,T
    real = (input_ids != config.pad_token_id).astype(np.int64)  # B,T
    positions: Array = np.cumsum(real, axis=1) * real + config.position_offset - 1  # B,T
    return positions


def embeddings(w: Weights, config: TextConfig, input_ids: Array, token_type_ids: Array | None) -> Array:
    """Word + position (+ token type) embeddings, before their LayerNorm."""
    x = w["embeddings.word_embeddings.weight"][input_ids]  # B,T,C
    x = x + w["embeddings.position_embeddings.weight"][position_ids(input_ids, config)]  # B,T,C
    if config.type_vocab_size > 0:
        types = np.zeros_like(input_ids) if token_type_ids is None else token_type_ids  # B,T
        x = x + w["embeddings.token_type_embeddings.weight"][types]  # B,T,C
    return np.asarray(x, dtype=np.float64)


def norm(x: Array, w: Weights, name: str, config: TextConfig, stats: dict[str, tuple[Array, Array]]) -> Array:
    """A LayerNorm (eps inside the square root), recording its input's mean and std per token.

    The std is sqrt of the variance without bias correction and without eps: the input's own spread.
    """
    r = layer_norm(x, 1, config.layer_norm_eps, "var", w[f"{name}.weight"], w[f"{name}.bias"])
    stats[name] = (r.mean, np.sqrt(r.var))  # B,T each
    return r.output  # B,T,C


def attention(x: Array, w: Weights, names: tuple[str, str, str, str], heads: int, attention_mask: Array) -> Array:
    """Scaled dot-product self-attention over the real keys: padding keys get a large negative score.

    names: the query, key, value and output projections' prefixes.
    """
    B, T, C = x.shape
    hs = C // heads

    def split(prefix: str) -> Array:
        y = linear(x, w[f"{prefix}.weight"], w[f"{prefix}.bias"])  # B,T,C
        return np.ascontiguousarray(y.reshape(B, T, heads, hs).transpose(0, 2, 1, 3))  # B,H,T,hs

    q, k, v = split(names[0]), split(names[1]), split(names[2])
    # k transposed contiguous: NumPy's stacked matmul is 5x slower on a strided operand (BERT, 256 tokens)
    scores = q @ np.ascontiguousarray(k.transpose(0, 1, 3, 2)) / math.sqrt(hs)  # B,H,T,T
    scores = scores + (1.0 - attention_mask[:, None, None, :]) * MASKED_OFFSET  # B,H,T,T: keys only
    y = (softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(B, T, C)  # B,T,C
    return linear(y, w[f"{names[3]}.weight"], w[f"{names[3]}.bias"])  # B,T,C


def feed_forward(x: Array, w: Weights, names: tuple[str, str], activation: str) -> Array:
    """Linear C->F, the activation of hidden_act, Linear F->C."""
    h = ACTIVATIONS[activation](linear(x, w[f"{names[0]}.weight"], w[f"{names[0]}.bias"]))  # B,T,F
    return linear(h, w[f"{names[1]}.weight"], w[f"{names[1]}.bias"])  # B,T,C


def layer(
    x: Array, w: Weights, i: int, config: TextConfig, attention_mask: Array, stats: dict[str, tuple[Array, Array]]
) -> Array:
    """One post-LN layer: x = LN(x + attention(x)); x = LN(x + feed_forward(x))."""
    if config.model_type == "distilbert":
        p = f"transformer.layer.{i}"
        projections = (f"{p}.attention.q_lin", f"{p}.attention.k_lin", f"{p}.attention.v_lin", f"{p}.attention.out_lin")
        ffn, norms = (f"{p}.ffn.lin1", f"{p}.ffn.lin2"), (f"{p}.sa_layer_norm", f"{p}.output_layer_norm")
    else:
        p = f"encoder.layer.{i}"
        a = f"{p}.attention"
        projections = (f"{a}.self.query", f"{a}.self.key", f"{a}.self.value", f"{a}.output.dense")
        ffn, norms = (
            (f"{p}.intermediate.dense", f"{p}.output.dense"),
            (f"{a}.output.LayerNorm", f"{p}.output.LayerNorm"),
        )
    x = norm(x + attention(x, w, projections, config.num_attention_heads, attention_mask), w, norms[0], config, stats)
    return norm(x + feed_forward(x, w, ffn, config.hidden_act), w, norms[1], config, stats)  # B,T,C


def pool(h: Array, attention_mask: Array, pooling: str) -> Array:
    """The sentence's vector: the mean over its real tokens (sentence-transformers' Pooling), or its first token's.

    Pooling "none" has no sentence vector of its own; its embedding is the first token's, as "cls".
    """
    if pooling == "mean":
        m = attention_mask[:, :, None]  # B,T,1
        mean: Array = (h * m).sum(axis=1) / np.maximum(m.sum(axis=1), MIN_TOKEN_COUNT)  # B,C
        return mean
    out: Array = h[:, 0]  # B,C
    return out


def l2_normalize(x: Array) -> Array:
    """Each row divided by its Euclidean norm (clamped as torch.nn.functional.normalize clamps it)."""
    out: Array = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), NORM_EPS)  # B,C
    return out


def encode(
    weights: Weights,
    config: TextConfig,
    input_ids: Array,
    attention_mask: Array,
    token_type_ids: Array | None = None,
) -> TextOutputs:
    """The model on a padded batch of token ids: embeddings, their LayerNorm, the layers, pooling, normalization.

    input_ids, attention_mask (1 real, 0 padding) and token_type_ids are (B,T) integers.
    """
    input_ids = np.asarray(input_ids, dtype=np.int64)
    assert input_ids.ndim == 2, f"input_ids of shape {input_ids.shape}; expected (batch, seq)"
    mask = np.asarray(attention_mask, dtype=np.float64)  # B,T
    assert mask.shape == input_ids.shape, f"attention_mask {mask.shape} != input_ids {input_ids.shape}"
    stats: dict[str, tuple[Array, Array]] = {}
    x = norm(embeddings(weights, config, input_ids, token_type_ids), weights, "embeddings.LayerNorm", config, stats)
    for i in range(config.num_hidden_layers):
        x = layer(x, weights, i, config, mask, stats)  # B,T,C
    sentence = pool(x, mask, config.pooling)  # B,C
    return TextOutputs(x, l2_normalize(sentence) if config.normalize else sentence, stats)
