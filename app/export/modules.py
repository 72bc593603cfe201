"""PyTorch modules behind the exported ONNX models, twins of app.reference in dependency order."""

from __future__ import annotations

import math
import pickletools
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from app.core.reference import MASKED_SCORE, EncoderConfig, positional_encoding

Rename = Callable[[str], str]  # a key of normserve's state_dict -> the checkpoint's name for it
Stats = list[tuple[Tensor, Tensor]]  # (mean (B,T), std (B,T)) of each LayerNorm's input, in execution order


class CheckpointError(ValueError):
    """A checkpoint that is not a state_dict of the configured encoder."""


class RowLayerNorm(nn.Module):
    """LayerNorm of each row of a 2-D view, with eps as per-row inputs: the graph of models/layernorm.onnx.

    Built from primitive ops rather than the fused LayerNormalization op, because eps is an input:
    eps_var (R,1) goes under the square root (mode "var"), eps_std (R,1) is added to the std (mode "std");
    the server zeroes the one it does not use, and may rescale rows by powers of two with eps adjusted.
    """

    def forward(
        self, x: Tensor, gamma: Tensor, beta: Tensor, eps_var: Tensor, eps_std: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        mean = x.mean(dim=-1, keepdim=True)  # R,1
        xshift = x - mean  # R,D
        var = (xshift * xshift).mean(dim=-1, keepdim=True)  # R,1 population variance: no bias correction
        denom = torch.sqrt(var + eps_var) + eps_std  # R,1
        out = xshift / denom * gamma + beta  # R,D
        return out, mean, 1.0 / denom


class LayerNorm(nn.Module):
    """nn.LayerNorm over the last dim that also records its input's mean and std per position.

    affine=False (elementwise_affine=False) has no weight and no bias; bias=False no bias: the state_dict
    then lacks those keys, as nn.LayerNorm's does, and the reference leaves them out alike.
    """

    def __init__(self, d_model: int, eps: float, affine: bool = True, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model)) if affine else None
        self.bias = nn.Parameter(torch.zeros(d_model)) if affine and bias else None
        self.eps = eps

    def forward(self, x: Tensor, stats: Stats) -> Tensor:
        # correction=0 is the population variance of the math; bare torch.var would be unbiased (N-1).
        var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)  # B,T,1 each
        stats.append((mean.squeeze(-1), var.sqrt().squeeze(-1)))  # B,T each
        y = (x - mean) * torch.rsqrt(var + self.eps)  # B,T,C
        if self.weight is not None:
            y = y * self.weight
        return y if self.bias is None else y + self.bias


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention with a key padding mask."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        assert cfg.d_model % cfg.num_heads == 0, f"d_model {cfg.d_model} is not divisible by num_heads {cfg.num_heads}"
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)  # q, k, v stacked as in_proj_weight
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)

    def forward(self, x: Tensor, padding_mask: Tensor) -> Tensor:
        B, T, C = x.shape
        H, hs = self.num_heads, C // self.num_heads
        q, k, v = self.qkv(x).split(C, dim=2)  # B,T,C each
        q = q.reshape(B, T, H, hs).transpose(1, 2)  # B,H,T,hs
        k = k.reshape(B, T, H, hs).transpose(1, 2)  # B,H,T,hs
        v = v.reshape(B, T, H, hs).transpose(1, 2)  # B,H,T,hs
        att = q @ k.transpose(-2, -1) / math.sqrt(hs)  # B,H,T,T
        # Replaced, not offset by -inf: a fully padded row then attends uniformly instead of giving NaN.
        att = att.masked_fill(padding_mask[:, None, None, :], MASKED_SCORE)  # B,H,T,T
        y = F.softmax(att, dim=-1) @ v  # B,H,T,hs
        out: Tensor = self.proj(y.transpose(1, 2).reshape(B, T, C))  # B,T,C
        return out


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,  # the erf form: ONNX's Erf, torch's approximate="none"
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class FeedForward(nn.Module):
    """Position-wise Linear -> activation -> Linear."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.activation = ACTIVATIONS[cfg.activation]

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc2(self.activation(self.fc1(x)))  # B,T,C
        return out


class EncoderLayer(nn.Module):
    """One Transformer encoder layer, post-LN (the original paper) or pre-LN (seed 004)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.norm_first = cfg.norm_first
        self.attn = SelfAttention(cfg)
        self.ff = FeedForward(cfg)
        self.norm1 = LayerNorm(cfg.d_model, cfg.eps, bias=cfg.bias)
        self.norm2 = LayerNorm(cfg.d_model, cfg.eps, bias=cfg.bias)

    def forward(self, x: Tensor, padding_mask: Tensor, stats: Stats) -> Tensor:
        if self.norm_first:
            x = x + self.attn(self.norm1(x, stats), padding_mask)
            x = x + self.ff(self.norm2(x, stats))
        else:
            x = self.norm1(x + self.attn(x, padding_mask), stats)
            x = self.norm2(x + self.ff(x), stats)
        return x


class Encoder(nn.Module):
    """Positional encoding (sinusoidal or none), the layer stack and a final norm or none; returns output then each
    norm's stats.

    forward returns (output, mean_0, std_0, mean_1, std_1, ...) flat, the order of the ONNX outputs.
    """

    pe: Tensor

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # The reference's float64 table rounded once to float32: computing it in float32, as seed 002 does,
        # is off by up to 3e-5 at the far positions. Not persistent, so the state dict holds only the weights.
        pe = torch.from_numpy(positional_encoding(cfg.max_sequence_length, cfg.d_model)).to(torch.float32)
        self.register_buffer("pe", pe, persistent=False)  # T_max,C
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_layers))
        final_eps = cfg.eps if cfg.final_eps is None else cfg.final_eps
        self.norm = LayerNorm(cfg.d_model, final_eps, bias=cfg.bias) if cfg.has_final_norm else None

    def forward(self, x: Tensor, padding_mask: Tensor) -> tuple[Tensor, ...]:
        stats: Stats = []
        if self.cfg.positional_encoding == "sinusoidal":
            x = x + self.pe[: x.shape[1]]  # B,T,C
        for layer in self.layers:
            x = layer(x, padding_mask, stats)
        if self.norm is not None:
            x = self.norm(x, stats)
        return (x, *(t for mean_std in stats for t in mean_std))


def seeded_encoder(cfg: EncoderConfig, seed: int = 0) -> Encoder:
    """An encoder in eval mode with torch's default init under `seed`.

    LayerNorm weights are drawn as 1 + 0.1*randn and biases as 0.1*randn rather than left at 1 and 0,
    so that parity checks exercise gamma and beta.
    """
    torch.manual_seed(seed)
    model = Encoder(cfg)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LayerNorm) and module.weight is not None and module.bias is not None:
                module.weight.copy_(1.0 + 0.1 * torch.randn_like(module.weight))
                module.bias.copy_(0.1 * torch.randn_like(module.bias))
    return model.eval()


def load_checkpoint(model: nn.Module, path: Path) -> None:
    """Load a state_dict file into model strictly, naming every missing, unexpected or misshapen key."""
    load_state(model, read_state_dict(path), path)


def pickled_module(path: Path) -> str | None:
    """The class of the object a torch.save file holds, when it is a torch.nn module saved whole, else None.

    Read from the pickle's opcodes without running them (the file is not trusted yet): the first class it names
    is the saved object's, and only a module's pickle names torch.nn's module classes (a state_dict's names
    OrderedDict and tensors). torch.save writes protocol 2, whose GLOBAL opcodes carry "module name".
    """
    try:
        with zipfile.ZipFile(path) as archive:
            pickle = next((n for n in archive.namelist() if n.endswith("/data.pkl")), None)
            data = archive.read(pickle) if pickle is not None else b""
        names = [str(arg).replace(" ", ".") for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"]
    except (OSError, ValueError, zipfile.BadZipFile):
        return None
    if not any(name.startswith("torch.nn.modules.") for name in names):
        return None
    first = names[0]
    return f"torch.nn.{first.rpartition('.')[2]}" if first.startswith("torch.nn.modules.") else first


def read_state_dict(path: Path) -> dict[str, Tensor]:
    """A state_dict file, loaded with torch.load(weights_only=True): CheckpointError for anything else."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as e:  # the weights-only unpickler fails on foreign bytes with any error type
        if (cls := pickled_module(path)) is not None:
            command = "layernorm" if cls.endswith(".LayerNorm") else "encoder"
            raise CheckpointError(
                f"{path}: this is a whole module ({cls}), not a state_dict: use --module "
                f"(`normserve export {command} --module`)"
            ) from e
        raise CheckpointError(
            f"{path}: not loadable with torch.load(weights_only=True) ({type(e).__name__}); "
            "expected a file written by torch.save(model.state_dict(), path)"
        ) from e
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        kind = type(state).__name__
        raise CheckpointError(f"{path}: expected a state_dict (a mapping of names to tensors), got a {kind}")
    return dict(state)


def load_state(
    model: nn.Module,
    state: Mapping[str, Tensor],
    path: Path,
    rename: Rename = str,
    described: str = "the configured encoder",
) -> None:
    """Load state into model strictly; rename maps model's keys to the checkpoint's, whose names errors use."""
    expected = {rename(key): value for key, value in model.state_dict().items()}
    problems = _state_dict_mismatches(expected, state)
    if problems:
        raise CheckpointError(
            f"{path} does not fit {described} ({'; '.join(problems)}); "
            "check --d-model, --d-ff, --num-layers and the norm placement"
        )
    model.load_state_dict({key: state[rename(key)] for key in model.state_dict()}, strict=True)


def _state_dict_mismatches(expected: Mapping[str, Tensor], got: Mapping[str, Tensor]) -> list[str]:
    problems = []
    if missing := sorted(expected.keys() - got.keys()):
        problems.append(f"missing keys {_some(missing)}")
    if unexpected := sorted(got.keys() - expected.keys()):
        problems.append(f"unexpected keys {_some(unexpected)}")
    if shapes := [
        f"{k} {list(got[k].shape)} != {list(v.shape)}"
        for k, v in expected.items()
        if k in got and got[k].shape != v.shape
    ]:
        problems.append(f"shape mismatch: {_some(shapes)}")
    return problems


def _some(items: list[str], limit: int = 4) -> str:
    """The first few items and how many more, so that the error stays one readable line."""
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more
