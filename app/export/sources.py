"""Users' whole modules (`--module`): every setting read from the module, anything not served exactly refused by name.

A module saved with torch.save(module) is read into normserve's Encoder (app/export/modules.py), the twin
that is exported, and kept as the ground truth that parity measures the export against: its forward in
eval mode, fed the served layout (batch first) and a key-padding mask. PyTorch's fast path returns zeros
at padded positions, so answers are compared at unpadded positions only.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from app.core.reference import EncoderConfig, positional_encoding
from app.export.checkpoints import torch_name
from app.export.modules import CheckpointError, Encoder, LayerNorm, load_state
from app.export.parity import Forward

# Measured: a layer with nn.GELU(approximate="tanh") answers 1e-4 apart on its two paths (inputs of std 3).
TANH_NOTE = (
    'nn.GELU(approximate="tanh") is served in its tanh form, as the module trains; PyTorch\'s inference fast path '
    "(eval mode, no grad) computes the exact GELU for it instead, so parity is measured with that path off"
)
# torch 2.13's fast path reads each layer's LayerNorm weight and bias as tensors: where one is None (bias=False,
# elementwise_affine=False) in a layer whose other biases are on, it raises AttributeError ('NoneType' object has
# no attribute 'device') instead of answering. Its ordinary path computes the same layer.
NORM_NOTE = (
    "PyTorch's inference fast path (eval mode, no grad) fails on a layer's LayerNorm without weight or bias, "
    "so parity is measured with that path off"
)
ENCODER_CLASSES = "torch.nn.TransformerEncoder, torch.nn.TransformerEncoderLayer or normserve's Encoder"


@dataclasses.dataclass(frozen=True)
class UserEncoder:
    """The twin to export, the user's module as a function of the served input, and what the module was."""

    twin: Encoder
    forward: Forward
    source: dict[str, Any]  # the manifest's record: class, batch_first


def load_module(path: Path) -> nn.Module:
    """torch.load(weights_only=False): a pickled module runs code from the file, as the help says."""
    try:
        module = torch.load(path, map_location="cpu", weights_only=False)
    except OSError:
        raise
    except Exception as e:  # unpickling fails with any error type
        raise CheckpointError(f"{path}: not loadable with torch.load ({type(e).__name__}: {e})") from e
    if isinstance(module, Mapping):
        raise CheckpointError(f"{path}: a state_dict, not a whole module; export it with --checkpoint")
    if not isinstance(module, nn.Module):
        raise CheckpointError(f"{path}: a {type(module).__name__}, not a module saved with torch.save(module)")
    return module.eval()


def class_name(obj: object) -> str:
    """torch.nn.LayerNorm for torch's modules (not torch.nn.modules.normalization.LayerNorm), else module.qualname."""
    cls = obj if isinstance(obj, type) else type(obj)
    if cls.__module__.startswith("torch.nn.") and getattr(nn, cls.__name__, None) is cls:
        return f"torch.nn.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def user_encoder(module: nn.Module, path: Path, max_sequence_length: int, pe: str | None) -> UserEncoder:
    """The twin of an encoder module and its forward; CheckpointError names what cannot be served exactly."""
    if isinstance(module, Encoder):
        if pe not in (None, module.cfg.positional_encoding):
            raise CheckpointError(f"{path}: its positional encoding is {module.cfg.positional_encoding}, not {pe}")
        cfg = dataclasses.replace(module.cfg, max_sequence_length=max_sequence_length)
        twin = Encoder(cfg).eval()
        twin.load_state_dict(module.state_dict())
        return UserEncoder(twin, lambda x, mask: _own_forward(module, cfg, x, mask), {"class": class_name(module)})
    if type(module) is nn.TransformerEncoder:
        layers, final = list(module.layers), module.norm
    elif type(module) is nn.TransformerEncoderLayer:
        layers, final = [module], None
    else:
        raise CheckpointError(f"{path}: {wrong_kind(module, 'encoder')}")
    try:
        settings = [_layer_settings(layer, f"layers.{i}") for i, layer in enumerate(layers)]
        final_norm = _final_norm(final, settings[0]["d_model"])
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    if differing := [f"layers.{i}" for i, s in enumerate(settings) if s != settings[0]]:
        raise CheckpointError(f"{path}: {', '.join(differing)} differ from layers.0 in their settings: {settings}")
    cfg = EncoderConfig(
        **settings[0],
        num_layers=len(layers),
        max_sequence_length=max_sequence_length,
        positional_encoding=pe or "none",
        **final_norm,
    )
    twin = _twin(cfg, module, path, len(layers) if type(module) is nn.TransformerEncoder else 0)
    batch_first = bool(layers[0].self_attn.batch_first)
    source = {"class": class_name(module), "batch_first": batch_first}
    plain = any(n.weight is None or n.bias is None for layer in layers for n in (layer.norm1, layer.norm2))
    if notes := [note for note, holds in ((TANH_NOTE, cfg.activation == "gelu_tanh"), (NORM_NOTE, plain)) if holds]:
        source["note"] = "; ".join(notes)
    fast = not notes
    return UserEncoder(twin, lambda x, mask: _torch_forward(module, cfg, batch_first, fast, x, mask), source)


def _layer_settings(layer: nn.Module, at: str) -> dict[str, Any]:
    """One TransformerEncoderLayer's EncoderConfig fields, or CheckpointError naming what is not served."""
    if type(layer) is not nn.TransformerEncoderLayer:
        raise CheckpointError(f"{at} is a {class_name(layer)}, not a torch.nn.TransformerEncoderLayer")
    attn = layer.self_attn
    if not attn._qkv_same_embed_dim or attn.bias_k is not None or attn.add_zero_attn:
        raise CheckpointError(f"{at}.self_attn has kdim/vdim, add_bias_kv or add_zero_attn, which are not served")
    norms = (layer.norm1, layer.norm2)
    for name, norm in zip(("norm1", "norm2"), norms, strict=True):
        _check_norm(norm, f"{at}.{name}", attn.embed_dim)
    if norms[0].eps != norms[1].eps:
        raise CheckpointError(f"{at}: norm1 eps {norms[0].eps:g} and norm2 eps {norms[1].eps:g} differ")
    return {
        "d_model": attn.embed_dim,
        "num_heads": attn.num_heads,
        "d_ff": layer.linear1.out_features,
        "norm_first": bool(layer.norm_first),
        "eps": float(norms[0].eps),
        "activation": activation_name(layer.activation, f"{at}.activation"),
        "bias": layer.linear1.bias is not None,
    }


def activation_name(activation: object, at: str) -> str:
    """relu, gelu or gelu_tanh for torch's own forms of them; CheckpointError naming anything else."""
    if activation is F.relu or type(activation) is nn.ReLU:
        return "relu"
    if activation is F.gelu:
        return "gelu"
    if type(activation) is nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}[activation.approximate]
    name = getattr(activation, "__qualname__", None) or class_name(activation)
    raise CheckpointError(
        f"{at} is {name}, which normserve cannot serve exactly; it serves relu and gelu "
        '("relu", "gelu", F.relu, F.gelu, nn.ReLU(), nn.GELU(approximate="none"|"tanh"))'
    )


def _check_norm(norm: object, at: str, d_model: int) -> None:
    if type(norm) is not nn.LayerNorm:
        raise CheckpointError(f"{at} is a {class_name(norm)}; normserve serves torch.nn.LayerNorm only")
    if tuple(norm.normalized_shape) != (d_model,):
        raise CheckpointError(f"{at} normalizes {list(norm.normalized_shape)}, not the last dim [{d_model}]")


def _final_norm(final: nn.Module | None, d_model: int) -> dict[str, Any]:
    if final is None:
        return {"final_norm": False}
    _check_norm(final, "norm", d_model)
    return {"final_norm": True, "final_eps": float(final.eps)}  # type: ignore[arg-type] # a LayerNorm's float


def _twin(cfg: EncoderConfig, module: nn.Module, path: Path, prefixed: int) -> Encoder:
    """normserve's Encoder with the module's weights, its LayerNorms affine or not as the module's are."""
    twin = Encoder(cfg).eval()
    state = dict(module.state_dict())
    if not prefixed:  # a lone layer's keys are the stack's layers.0.*
        state = {f"layers.0.{key}": value for key, value in state.items()}
    for name, norm in twin.named_modules():
        if isinstance(norm, LayerNorm):  # each as the module's: the final norm may differ from the layers'
            norm.weight = nn.Parameter(torch.ones(cfg.d_model)) if f"{name}.weight" in state else None
            norm.bias = nn.Parameter(torch.zeros(cfg.d_model)) if f"{name}.bias" in state else None
    load_state(twin, state, path, torch_name)
    return twin


def _torch_forward(
    module: nn.Module, cfg: EncoderConfig, batch_first: bool, may_fast: bool, x: np.ndarray, mask: Any
) -> np.ndarray:
    """The user's module in eval mode on the served input (plus the positional encoding the export adds, if any),
    on torch's fast path where it may take it (not where TANH_NOTE or NORM_NOTE says why)."""
    if cfg.positional_encoding == "sinusoidal":
        x = x + positional_encoding(x.shape[1], x.shape[2]).astype(np.float32)
    src = torch.from_numpy(np.ascontiguousarray(x))
    src = src if batch_first else src.transpose(0, 1)  # T,B,C for batch_first=False
    padding = None if mask is None else torch.from_numpy(mask)
    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(fast and may_fast)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The PyTorch API of nested tensors", UserWarning)  # its fast path's
            out: Tensor = module.eval()(src, src_key_padding_mask=padding)
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)
    return (out if batch_first else out.transpose(0, 1)).numpy()


def _own_forward(module: nn.Module, cfg: EncoderConfig, x: np.ndarray, mask: Any) -> np.ndarray:
    padding = np.zeros(x.shape[:2], dtype=bool) if mask is None else mask
    with torch.no_grad():
        out: Tensor = module.eval()(torch.from_numpy(x), torch.from_numpy(padding))[0]
    return out.numpy()


def user_layernorm(module: nn.Module, path: Path) -> nn.LayerNorm:
    """A torch.nn.LayerNorm module as it is; CheckpointError for anything else, naming it."""
    if type(module) is not nn.LayerNorm:
        raise CheckpointError(f"{path}: {wrong_kind(module, 'layernorm')}")
    return module


def wrong_kind(module: nn.Module, command: str) -> str:
    """What a module is, and which command takes it (the other kind's, or none)."""
    name = class_name(module)
    if type(module) is nn.LayerNorm:
        shape = list(module.normalized_shape)
        return f"this is a {name} module (normalized_shape {shape}): `normserve export layernorm --module` takes it"
    if type(module) in (nn.TransformerEncoder, nn.TransformerEncoderLayer) or isinstance(module, Encoder):
        return f"this is a {name} module: `normserve export encoder --module` takes it"
    takes = ENCODER_CLASSES if command == "encoder" else "torch.nn.LayerNorm"
    if type(module) is nn.RMSNorm:
        return (
            f"this is a {name} module, which normserve cannot serve exactly (it does not subtract the mean); "
            f"`normserve export {command} --module` takes {takes}"
        )
    return f"this is a {name} module; `normserve export {command} --module` takes {takes}"
