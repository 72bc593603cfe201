"""The V2 view of each model: its tensors and request parameters, and the translation to the data plane.

The tensors here are the protocol's, not the ONNX graph's: layernorm's graph takes
conditioned (rows, cols) inputs, but a V2 client sends `input` of any rank and reads
back `output`, `mean` and `inv_std_dev`; app/dataplane.py does the work in between.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.core import dataplane
from app.core.runtime import Model, Runtime
from app.errors import InvalidInput

FLOAT = ("FP32", "FP64")  # accepted for float inputs; FP64 is converted once to float32
PLATFORM = "onnxruntime_onnx"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as model metadata reports it; -1 is a dim of any size."""

    name: str
    datatypes: tuple[str, ...]  # accepted on input; metadata reports the first
    shape: tuple[int, ...]
    optional: bool = False
    # Triton has no notation for "any rank": shape [-1] is what tritonclient and perf_analyzer
    # parse, so [-1] with any_rank means "rank >= 1, every dim of any size", not "rank 1".
    any_rank: bool = False

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatypes[0], "shape": list(self.shape)}

    def check_shape(self, shape: list[int], field: str) -> None:
        if self.any_rank:
            return
        if len(shape) != len(self.shape) or any(d not in (-1, s) for d, s in zip(self.shape, shape, strict=True)):
            raise InvalidInput(f"shape {shape} does not match the model's {list(self.shape)} (-1 = any size)", field)


@dataclass(frozen=True)
class V2Model:
    model: Model
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parameters: tuple[str, ...]  # request parameters the model reads

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.model.name,
            "versions": [self.model.version],
            "platform": PLATFORM,
            "inputs": [t.metadata() for t in self.inputs],
            "outputs": [t.metadata() for t in self.outputs],
        }


def describe(model: Model) -> V2Model:
    """The V2 tensors of a model.

    layernorm: `input` FP32 (or FP64) of any rank >= 1, reported as shape [-1]; optional `gamma`
    and `beta` of shape input.shape[-k:]; outputs `output` (input's shape), `mean` and
    `inv_std_dev` (input.shape[:-k], a scalar when k == rank), with k = parameter normalized_ndim.
    encoders: `input` [batch, seq, d_model], optional `padding_mask` BOOL [batch, seq] (true =
    padding); outputs `output` and, per LayerNorm in execution order, `{name}.mean` and `{name}.std`.
    """
    if model.kind == "layernorm":
        any_rank = TensorSpec("input", FLOAT, (-1,), any_rank=True)
        affine = [TensorSpec(n, FLOAT, (-1,), optional=True, any_rank=True) for n in ("gamma", "beta")]
        outputs = [TensorSpec(n, FLOAT, (-1,), any_rank=True) for n in ("output", "mean", "inv_std_dev")]
        return V2Model(model, (any_rank, *affine), tuple(outputs), ("eps", "eps_mode", "normalized_ndim"))
    assert model.config is not None, f"encoder {model.name} has no config"
    d = model.config.d_model
    inputs = (TensorSpec("input", FLOAT, (-1, -1, d)), TensorSpec("padding_mask", ("BOOL",), (-1, -1), optional=True))
    stats = [TensorSpec(f"{n}.{s}", FLOAT, (-1, -1)) for n in model.layer_norms for s in ("mean", "std")]
    return V2Model(model, inputs, (TensorSpec("output", FLOAT, (-1, -1, d)), *stats), ())


def infer(
    runtime: Runtime, spec: V2Model, tensors: Mapping[str, np.ndarray], params: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """Run the data plane; every output by name, float32 or float64 (the caller casts to the wire datatype)."""
    if spec.model.kind == "layernorm":
        return _layernorm(runtime, tensors, params)
    req = dataplane.EncodeInput(tensors["input"], tensors.get("padding_mask"), spec.model.name)
    out = dataplane.encode(runtime, req)
    results: dict[str, np.ndarray] = {"output": out.output}
    for name, mean, std in out.layer_norms:
        results[f"{name}.mean"], results[f"{name}.std"] = mean, std
    return results


def _layernorm(runtime: Runtime, tensors: Mapping[str, np.ndarray], params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    x = tensors["input"]
    eps, eps_mode, k = _layernorm_params(params, x.ndim)
    for name in ("gamma", "beta"):
        if name in tensors and tensors[name].shape != x.shape[x.ndim - k :]:
            raise InvalidInput(
                f"shape {list(tensors[name].shape)} does not match input's last {k} dims {list(x.shape[x.ndim - k :])}",
                f"inputs.{name}",
            )
    req = dataplane.NormalizeInput(x, k, eps, eps_mode, tensors.get("gamma"), tensors.get("beta"))
    out = dataplane.normalize(runtime, req)
    # From the data plane's float64 variance, so FP64 clients get every digit it has.
    if eps_mode == "var":
        inv_std_dev = 1.0 / np.sqrt(out.var + eps)
    else:
        inv_std_dev = 1.0 / (np.sqrt(out.var) + eps)
    return {"output": out.output, "mean": out.mean, "inv_std_dev": inv_std_dev}


def _layernorm_params(params: Mapping[str, Any], rank: int) -> tuple[float, str, int]:
    eps = params.get("eps", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps > 0:
        raise InvalidInput(f"expected a number > 0, got {eps!r}", "parameters.eps")
    eps_mode = params.get("eps_mode", "var")
    if eps_mode not in ("var", "std"):
        raise InvalidInput(f"expected 'var' or 'std', got {eps_mode!r}", "parameters.eps_mode")
    k = params.get("normalized_ndim", 1)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= rank:
        raise InvalidInput(f"expected an integer in 1..{rank} (input's rank), got {k!r}", "parameters.normalized_ndim")
    return float(eps), eps_mode, k
