"""Users' checkpoints: a trained encoder (normserve's own or torch.nn.TransformerEncoder) or torch.nn.LayerNorm.

A state_dict records shapes but not every setting: d_model, d_ff, num_layers, bias and the final norm
are read from it, while num_heads (in_proj_weight is (3C, C) for any head count), the activation, the
norm placement and eps are not in it at all: --num-heads is required, the others are flags with
documented defaults (relu; pre-LN exactly when there is a final norm; 1e-5). PyTorch's modules add no
positional encoding, normserve's own encoder adds the sinusoidal one: that is each one's default.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from app.core.reference import ACTIVATIONS, POSITIONAL_ENCODINGS, EncoderConfig
from app.export.modules import CheckpointError, Encoder, load_state, read_state_dict

# torch.nn.TransformerEncoderLayer's keys -> normserve's EncoderLayer's, under layers.N. (`norm` is `norm` in both).
TORCH_LAYER_KEYS = {
    "self_attn.in_proj_weight": "attn.qkv.weight",  # q, k, v stacked: the layout of attn.qkv
    "self_attn.in_proj_bias": "attn.qkv.bias",
    "self_attn.out_proj.weight": "attn.proj.weight",
    "self_attn.out_proj.bias": "attn.proj.bias",
    "linear1.weight": "ff.fc1.weight",
    "linear1.bias": "ff.fc1.bias",
    "linear2.weight": "ff.fc2.weight",
    "linear2.bias": "ff.fc2.bias",
}
TO_TORCH = {ours: theirs for theirs, ours in TORCH_LAYER_KEYS.items()}
LAYER_KEY = re.compile(r"layers\.(\d+)\.(.+)")


def is_torch_encoder(state: Mapping[str, Tensor]) -> bool:
    """A state_dict of torch.nn.TransformerEncoder: its layers have self_attn.in_proj_weight."""
    return any(LAYER_KEY.fullmatch(key) and key.endswith(".self_attn.in_proj_weight") for key in state)


def is_layernorm(state: Mapping[str, Tensor]) -> bool:
    """A state_dict of torch.nn.LayerNorm: weight and (unless bias=False) bias, nothing else."""
    return "weight" in state and state.keys() <= {"weight", "bias"}


def describe(state: Mapping[str, Tensor]) -> str:
    """What a state_dict is, in torch's words, for the messages of a checkpoint given to the wrong command."""
    if is_layernorm(state):
        shapes = ", ".join(f"{key} {list(state[key].shape)}" for key in ("weight", "bias") if key in state)
        return f"this is a torch.nn.LayerNorm state_dict ({shapes}): `normserve export layernorm` takes it"
    torch_format = is_torch_encoder(state)
    if torch_format or any(LAYER_KEY.fullmatch(key) for key in state):
        cfg = infer_config(state, {}, torch_format)
        owner = "torch.nn.TransformerEncoder" if torch_format else "normserve Encoder"
        return (
            f"this is a {owner} state_dict ({cfg.num_layers} layers, d_model {cfg.d_model}): "
            "`normserve export encoder` takes it"
        )
    return (
        f"this state_dict is neither a torch.nn.TransformerEncoder's nor a torch.nn.LayerNorm's (keys {_keys(state)})"
    )


def _keys(state: Mapping[str, Tensor], limit: int = 4) -> str:
    keys = sorted(state)
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def torch_name(key: str) -> str:
    """normserve's key -> torch's: layers.0.attn.qkv.weight -> layers.0.self_attn.in_proj_weight."""
    match = LAYER_KEY.fullmatch(key)
    if match is None or match.group(2) not in TO_TORCH:
        return key
    return f"layers.{match.group(1)}.{TO_TORCH[match.group(2)]}"


def infer_config(state: Mapping[str, Tensor], given: Mapping[str, Any], torch_format: bool) -> EncoderConfig:
    """The encoder's size: the flags given, and otherwise what the checkpoint's shapes say.

    A size the checkpoint does not show (a key missing) stays at its default: loading then names the key.
    """
    name = torch_name if torch_format else str
    inferred: dict[str, Any] = {}
    if (norm := state.get(name("layers.0.norm1.weight"))) is not None and norm.ndim == 1:
        inferred["d_model"] = norm.shape[0]
    if (fc1 := state.get(name("layers.0.ff.fc1.weight"))) is not None and fc1.ndim == 2:
        inferred["d_ff"] = fc1.shape[0]
    layers = [int(m.group(1)) for key in state if (m := LAYER_KEY.fullmatch(key))]
    if layers:
        inferred["num_layers"] = max(layers) + 1
    inferred["final_norm"] = inferred["norm_first"] = "norm.weight" in state or "norm.bias" in state
    inferred["bias"] = name("layers.0.ff.fc1.bias") in state
    inferred["positional_encoding"] = "none" if torch_format else "sinusoidal"
    chosen = {**inferred, **{k: v for k, v in given.items() if v is not None}}
    return dataclasses.replace(EncoderConfig(), **chosen)


def load_encoder(path: Path, given: Mapping[str, Any]) -> Encoder:
    """An Encoder in eval mode with the checkpoint's weights; CheckpointError names a missing or misshapen key."""
    state = read_state_dict(path)
    if "self_attn.in_proj_weight" in state:  # a lone TransformerEncoderLayer's: the stack's layers.0
        state = {f"layers.0.{key}": value for key, value in state.items()}
    torch_format = is_torch_encoder(state)
    if not torch_format and not any(LAYER_KEY.fullmatch(key) for key in state):
        raise CheckpointError(f"{path}: {describe(state)}")
    cfg = infer_config(state, given, torch_format)
    check_config(cfg)
    model = Encoder(cfg).eval()
    owner = "torch.nn.TransformerEncoder" if torch_format else "normserve Encoder"
    final = "a final norm" if cfg.has_final_norm else "no final norm"
    read = f"d_model {cfg.d_model}, d_ff {cfg.d_ff}, {cfg.num_layers} layers, {final}, bias={cfg.bias}"
    described = f"the {owner} that its keys and the flags describe ({read})"
    load_state(model, state, path, torch_name if torch_format else str, described)
    return model


def check_config(cfg: EncoderConfig) -> None:
    """ValueError for an encoder size the modules cannot build."""
    if cfg.d_model % 2 or cfg.d_model % cfg.num_heads:
        raise ValueError(f"d_model {cfg.d_model} must be even and divisible by num_heads {cfg.num_heads}")
    if min(cfg.d_ff, cfg.num_layers, cfg.num_heads) < 1 or cfg.max_sequence_length < 2 or cfg.eps <= 0:
        raise ValueError(f"d_ff, num_layers and eps must be positive and max_sequence_length at least 2: {cfg}")
    if cfg.activation not in ACTIVATIONS or cfg.positional_encoding not in POSITIONAL_ENCODINGS:
        raise ValueError(f"activation {cfg.activation!r} or positional_encoding {cfg.positional_encoding!r} unknown")


def load_layernorm(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """gamma and beta (float32, normalized_shape) of a torch.nn.LayerNorm's state_dict.

    LayerNorm(bias=False) has no `bias`: beta is zero. LayerNorm(elementwise_affine=False) has no weights
    at all, so nothing would tell its normalized_shape: it is refused (the default layernorm model serves it).
    """
    state = read_state_dict(path)
    if not state:
        raise CheckpointError(
            f"{path}: an empty state_dict (torch.nn.LayerNorm(elementwise_affine=False) has no weights); "
            "the default layernorm model serves it, with eps in each request"
        )
    if not is_layernorm(state):
        raise CheckpointError(f"{path}: {describe(state)}")
    weight = state["weight"]
    bias = state.get("bias", weight.new_zeros(weight.shape))
    if bias.shape != weight.shape or weight.ndim == 0 or weight.numel() == 0:
        raise CheckpointError(
            f"{path}: shape mismatch: weight {list(weight.shape)}, bias {list(bias.shape)}; "
            "expected both of the normalized_shape"
        )
    return weight.detach().float().numpy().copy(), bias.detach().float().numpy().copy()
