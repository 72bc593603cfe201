"""The user's Hugging Face encoder as one ONNX graph: tokens in; sentence vector, hidden states, LayerNorm inputs out.

The base model runs as transformers builds it (eager attention: softmax(QK^T + mask) V, which exports as plain
ops); a wrapper adds the folder's pooling and normalization, and each LayerNorm's input statistics, captured by
forward pre-hooks in the order the LayerNorms run.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

# Nothing is ever fetched from a hub: huggingface_hub reads these once, when it is first imported.
os.environ["HF_HUB_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np
import onnx
import torch
import transformers
from torch import nn

from app.core import textencoder, textreference
from app.core.model import Signature
from app.core.textreference import TextConfig
from app.export import graph
from app.export.graph import ExportError
from app.export.textsource import Head, UnsupportedModel

MIN_TOKEN_COUNT = 1e-9  # sentence-transformers' Pooling clamps the token count so


def load_model(path: Path) -> nn.Module:
    """The folder's base model (AutoModel), float32, eval mode, eager attention."""
    try:
        model = transformers.AutoModel.from_pretrained(
            str(path), attn_implementation="eager", dtype=torch.float32, local_files_only=True
        )
    except pickle.UnpicklingError:  # transformers reads pytorch_model.bin with torch.load(weights_only=True)
        raise UnsupportedModel(
            f"{path / 'pytorch_model.bin'}: holds more than weights (torch.load(weights_only=True) refuses it); "
            "normserve never unpickles objects from a model folder: save the model with save_pretrained "
            "(model.safetensors)"
        ) from None
    module: nn.Module = model.eval()
    return module


def weights(model: nn.Module) -> dict[str, np.ndarray]:
    """The base model's state_dict as float32 NumPy arrays, keyed as in the graph's LayerNorm names."""
    return {key: value.detach().to(torch.float32).numpy().copy() for key, value in model.state_dict().items()}


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, head: Head) -> torch.Tensor:
    """sentence-transformers' Pooling (mean over real tokens, or the first token) and Normalize."""
    if head.pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # B,T,1
        sentence = (hidden * mask).sum(1) / mask.sum(1).clamp(min=MIN_TOKEN_COUNT)  # B,C
    else:  # cls, and none: the reference's first token
        sentence = hidden[:, 0]  # B,C
    return nn.functional.normalize(sentence, p=2, dim=1) if head.normalize else sentence


def additive_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """The (B,1,T,T) float mask added to the attention scores: 0 where the key is a token, the lowest float where it
    is padding (transformers 4's _expand_mask, whose exported ops onnxruntime's attention fusion matches)."""
    b, t = attention_mask.shape
    inverted = 1.0 - attention_mask[:, None, None, :].expand(b, 1, t, t).to(torch.float32)
    return inverted.masked_fill(inverted.to(torch.bool), torch.finfo(torch.float32).min)


class TextEncoderGraph(nn.Module):
    """The base model, pooled, with each LayerNorm's input mean and std (population, no eps) per token."""

    def __init__(self, model: nn.Module, head: Head, token_types: bool) -> None:
        super().__init__()
        self.model, self.head, self.token_types = model, head, token_types
        self.names: list[str] = []  # LayerNorms in execution order, filled by the first run
        self._captured: list[tuple[str, torch.Tensor]] = []
        for name, module in model.named_modules():
            if isinstance(module, nn.LayerNorm):
                module.register_forward_pre_hook(self._capture(name))
        self.eval()  # the exporter puts a module back in its own mode afterwards: dropout must stay off

    def _capture(self, name: str) -> Any:
        def hook(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            self._captured.append((name, args[0]))

        return hook

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *types: torch.Tensor) -> tuple[Any, ...]:
        self._captured = []
        extra = {"token_type_ids": types[0]} if self.token_types else {}
        # The additive mask built here, as transformers 4 built it (transformers 5 takes a 4-D mask as it is): the
        # same values as transformers 5's own (0 at real tokens, float32's lowest at padding), in the form
        # onnxruntime's optimizer fuses into Attention (textfusion.py), which transformers 5's is not.
        hidden = self.model(
            input_ids=input_ids, attention_mask=additive_mask(attention_mask), **extra
        ).last_hidden_state  # B,T,C
        self.names = [name for name, _ in self._captured]
        stats: list[torch.Tensor] = []
        for _, x in self._captured:
            mean = x.mean(-1)  # B,T
            stats += [mean, (x - mean.unsqueeze(-1)).square().mean(-1).sqrt()]  # population std, ddof 0, no eps
        return (pool(hidden, attention_mask, self.head), hidden, *stats)


def to_onnx(module: TextEncoderGraph, config: TextConfig, opset: int) -> tuple[onnx.ModelProto, Signature, Signature]:
    """The TorchScript exporter (dynamo=False) with dynamic batch and seq, checked; and the signature it has."""
    # Example sizes above 1 on both axes, so that neither is taken for a constant; one padded row.
    ids = torch.full((2, 5), 5, dtype=torch.long)
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 3:] = 0
    example = (ids, mask) + ((torch.zeros_like(ids),) if module.token_types else ())
    with torch.no_grad():
        module(*example)  # the LayerNorms' execution order names the outputs
    inputs, outputs = textencoder.signature(config)
    if module.names != textreference.layer_norm_names(config):  # the reference and the server name them so
        raise ExportError(
            f"the model's LayerNorms run as {module.names}; a {config.model_type} model has "
            f"{textreference.layer_norm_names(config)}"
        )
    with tempfile.TemporaryDirectory() as scratch, graph.quiet_torch_export():
        torch.onnx.export(
            module,
            example,
            Path(scratch) / "model.onnx",
            input_names=[name for name, _ in inputs],
            output_names=[name for name, _ in outputs],
            dynamic_axes={name: {i: d for i, d in enumerate(shape) if isinstance(d, str)} for name, shape in inputs}
            | {name: {i: d for i, d in enumerate(shape) if isinstance(d, str)} for name, shape in outputs},
            opset_version=opset,
            dynamo=False,
        )
        proto = onnx.load(Path(scratch) / "model.onnx")
    for value, (_, shape) in zip(proto.graph.output, outputs, strict=True):
        for dim, size in zip(value.type.tensor_type.shape.dim, shape, strict=True):
            if isinstance(size, int):  # the exporter leaves the width symbolic behind a division (normalize)
                dim.dim_value = size
    return graph.checked(proto), inputs, outputs
