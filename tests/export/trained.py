"""Users' models as users train them: torch.nn.TransformerEncoder and torch.nn.LayerNorm, a few Adam steps on noise.

Trained rather than freshly initialized, so that no weight is torch's default (LayerNorm's 1 and 0 above
all) and an exporter that dropped or mixed up a weight would show in the outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from app.core.reference import EncoderConfig

STEPS = 5


@dataclass(frozen=True)
class UserEncoder:
    id: str
    cfg: EncoderConfig  # what the exporter should read (num_heads and max_sequence_length are flags)

    def __post_init__(self) -> None:
        # PyTorch's stacks add no positional encoding, and these end with a final norm exactly when pre-LN.
        cfg = dataclasses.replace(self.cfg, positional_encoding="none", final_norm=self.cfg.norm_first)
        object.__setattr__(self, "cfg", cfg)

    def build(self, seed: int = 0) -> nn.TransformerEncoder:
        """The torch stack, trained a few steps, in eval mode."""
        torch.manual_seed(seed)
        c = self.cfg
        layer = nn.TransformerEncoderLayer(
            c.d_model, c.num_heads, c.d_ff, dropout=0.0, activation="relu", batch_first=True, norm_first=c.norm_first
        )
        final = nn.LayerNorm(c.d_model) if c.norm_first else None
        model = nn.TransformerEncoder(layer, c.num_layers, norm=final, enable_nested_tensor=False)
        _train(model, model, (4, 6, c.d_model))
        return model.eval()


USER_ENCODERS = [
    UserEncoder("post-ln-32x4x1", EncoderConfig(d_model=32, num_heads=4, d_ff=64, num_layers=1)),
    UserEncoder(
        "pre-ln-48x6x3",
        EncoderConfig(d_model=48, num_heads=6, d_ff=96, num_layers=3, max_sequence_length=64, norm_first=True),
    ),
]


def torch_encode(model: nn.TransformerEncoder, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """torch's output for x and a padding mask (the export adds no positional encoding to a torch stack).

    Run in train mode (dropout is 0: the same math) so that torch takes its plain path, not the fast
    inference path, which returns zeros at padded positions.
    """
    model.train()
    try:
        with torch.no_grad():
            out = model(torch.from_numpy(x), src_key_padding_mask=torch.from_numpy(mask))
    finally:
        model.eval()
    return out.numpy()


def layer_norm(normalized_shape: tuple[int, ...], seed: int = 0, eps: float = 1e-5) -> nn.LayerNorm:
    """torch.nn.LayerNorm trained a few steps, in eval mode."""
    torch.manual_seed(seed)
    module = nn.LayerNorm(normalized_shape, eps=eps)
    _train(module, module, (4, 3, *normalized_shape))
    return module.eval()


def _train(model: nn.Module, forward: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, ...]) -> None:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(STEPS):
        x = torch.randn(shape)
        loss = (forward(x) - 2 * x.flip(-1) - 1).pow(2).mean()  # a target LayerNorm's 1 and 0 cannot fit
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def save(module: nn.Module, path: Path) -> Path:
    torch.save(module.state_dict(), path)
    return path


def gelu_encoder(seed: int = 0) -> nn.TransformerEncoder:
    """docs/checkpoints/my-gelu-encoder.pt, the README walkthrough's module: GELU, pre-LN, a final norm, eps 1e-6.

    Written with torch.save(gelu_encoder(), path): a whole module, as `normserve export encoder --module` takes it.
    """
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(
        32, 4, 64, dropout=0.0, activation="gelu", batch_first=True, norm_first=True, layer_norm_eps=1e-6
    )
    model = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(32, eps=1e-6), enable_nested_tensor=False)
    _train(model, model, (4, 6, 32))
    return model.eval()
