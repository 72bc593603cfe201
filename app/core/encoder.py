"""The encoder kind: a Transformer encoder (post-LN or pre-LN) whose graph also returns its LayerNorms' statistics.

Its graph takes `input` (B,T,C) and `padding_mask` (B,T, true = padding) and returns `output`
and, per LayerNorm in execution order, `{name}.mean` and `{name}.std` (B,T). The NumPy weights
(.npz beside the graph) let `validate` and the warm-up run the float64 reference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from app.core import heap, reference
from app.core.batching import Batcher
from app.core.dataplane import EncodeInput, EncodeOutput, EncoderLimits, Fields
from app.core.halfprecision import HALF_DTYPES, narrow
from app.core.model import (
    FLOAT,
    Loaded,
    Model,
    ModelLoadError,
    Signature,
    TensorSpec,
    positive_float,
    positive_int,
    read_weights,
)
from app.core.reference import POSITIONAL_ENCODINGS, EncoderConfig
from app.core.repository import MANIFEST
from app.core.tensors import check_finite
from app.errors import shown

STATS = ("mean", "std")
# An encoder request has no gamma or eps to change (check_finite's layernorm hint): only its input's scale.
OVERFLOW_HINT = "scale the input down"


def output_names(layer_norms: list[str]) -> list[str]:
    """`output`, then `{name}.mean` and `{name}.std` for each LayerNorm in execution order."""
    return ["output"] + [f"{name}.{stat}" for name in layer_norms for stat in STATS]


def signature(cfg: EncoderConfig) -> tuple[Signature, Signature]:
    """The graph's inputs and outputs; batch and seq are dynamic."""
    inputs: Signature = [("input", ["batch", "seq", cfg.d_model]), ("padding_mask", ["batch", "seq"])]
    stats: Signature = [(name, ["batch", "seq"]) for name in output_names(reference.layer_norm_names(cfg))[1:]]
    return inputs, [("output", ["batch", "seq", cfg.d_model]), *stats]


class EncoderModel(Model):
    """V2: `input` [batch, seq, d_model], optional `padding_mask` BOOL [batch, seq]; outputs as the graph's."""

    kind = "encoder"

    def __init__(self, loaded: Loaded) -> None:
        super().__init__(loaded)
        entry, s = loaded.entry, loaded.settings
        self.config = config(entry, loaded.path.parent / MANIFEST)
        self.limits = EncoderLimits(
            self.config.d_model, self.config.max_sequence_length, f"{self.name!r}, version {self.version}"
        )
        self.layer_norms: list[str] = reference.layer_norm_names(self.config)
        if entry.get("layer_norms") != self.layer_norms:
            raise ModelLoadError(
                f"{loaded.path.parent / MANIFEST}: layer_norms {shown(entry.get('layer_norms'))}; an encoder with "
                f"this config has {self.layer_norms}"
            )
        self.output_names = output_names(self.layer_norms)
        self.graph = signature(self.config)
        self.weights = read_weights(loaded)
        d = self.config.d_model
        self.inputs = (
            TensorSpec("input", FLOAT, (-1, -1, d)),
            TensorSpec("padding_mask", ("BOOL",), (-1, -1), optional=True),
        )
        stats = tuple(TensorSpec(n, FLOAT, (-1, -1), statistic=True) for n in self.output_names[1:])
        self.outputs = (TensorSpec("output", FLOAT, (-1, -1, d)), *stats)
        self.batching = batching(loaded)
        self.batcher = None
        if self.batching["max_batch_size"] > 1:  # dynamic batching (app/core/batching.py)
            b = self.batching
            self.batcher = Batcher(
                self.run,
                b["max_batch_size"],
                b["max_queue_delay_microseconds"],
                loaded.in_flight,
                f"{self.name}/{self.version}",
                b["max_sequence_length"],
            )
        self.validate_atol = s.validate_atol

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()

    def from_tensors(
        self, tensors: Mapping[str, np.ndarray], params: Mapping[str, Any], f: Fields, dtype: str = "FP32"
    ) -> EncodeInput:
        return EncodeInput(tensors["input"], tensors.get("padding_mask"), self.limits, fields=f, dtype=dtype)

    def to_tensors(self, result: EncodeOutput) -> dict[str, np.ndarray]:
        tensors = {"output": result.output}
        for name, mean, std in result.layer_norms:
            tensors[f"{name}.mean"], tensors[f"{name}.std"] = mean, std
        return tensors

    def infer(self, request: EncodeInput) -> EncodeOutput:
        """Run the graph (merged with concurrent requests when batching); LayerNorm statistics come out of it."""
        mask = request.mask
        with np.errstate(over="ignore"):
            if self.batcher is not None:
                outs = self.batcher.run(request.x, mask, self.output_names)
            else:
                outs = self.run({"input": request.x, "padding_mask": mask}, self.output_names)
        # A LayerNorm whose float32 variance overflowed normalizes nothing: pre-LN's first one, on a large input,
        # answered a finite but wrong output beside an infinite std (sent as null). Refused instead, naming the
        # first tensor that overflowed in execution order (the statistics, then the output).
        for i in [*range(1, len(outs)), 0]:
            check_finite(outs[i], self.output_names[i], hint=OVERFLOW_HINT)
        stats = [(n, outs[1 + 2 * i], outs[2 + 2 * i]) for i, n in enumerate(self.layer_norms)]
        validation = None
        if request.validate:
            ref, _ = reference.encoder(request.x, self.weights, self.config, mask)
            diff = float(np.abs(outs[0] - ref).max())
            atol = self.validate_atol
            validation = {"reference": "numpy", "max_abs_diff": diff, "atol": atol, "passed": diff <= atol}
        output = narrow(outs[0], request.dtype, "output") if request.dtype in HALF_DTYPES else outs[0]
        return EncodeOutput(output, stats, self.info, validation)

    def warm_up(self) -> tuple[float, float]:
        rng = np.random.default_rng(20261121)
        x = rng.standard_normal((2, 7, self.config.d_model)).astype(np.float32)
        mask = np.zeros((2, 7), dtype=bool)
        mask[1, 4:] = True
        out = self.infer(EncodeInput(x, mask, self.limits, validate=True))
        assert out.validation is not None
        self._check_longest()
        return out.validation["max_abs_diff"], self.validate_atol

    def _check_longest(self) -> None:
        """The longest sequence the manifest admits runs: a graph that cannot (its positional table is shorter
        than config.max_sequence_length) fails here, not on a request."""
        full = np.zeros((1, self.config.max_sequence_length, self.config.d_model), np.float32)
        try:
            feeds = {"input": full, "padding_mask": np.zeros(full.shape[:2], bool)}
            shape = self.run(feeds, ["output"], heap.shrinking_run())[0].shape  # its memory not kept for life
        except Exception as e:  # onnxruntime's classes derive from Exception only
            shape, error = (), type(e).__name__
        else:
            error = f"an output of shape {list(shape)}"
        if shape != full.shape:
            raise ModelLoadError(
                f"{self.path.parent / MANIFEST}: config.max_sequence_length {self.config.max_sequence_length}: "
                f"the graph fails on a sequence that long ({error})"
            )


def batching(loaded: Loaded) -> dict[str, int]:
    """Dynamic batching as Triton's config names it: the server's settings, overridden by the model's model.json."""
    s = loaded.settings
    own = loaded.policy.dynamic_batching if loaded.policy is not None else None
    defaults = {
        "max_batch_size": s.batch_max_size,
        "max_queue_delay_microseconds": s.batch_delay_us,
        "max_sequence_length": s.batch_max_seq_len,
    }
    return {**defaults, **(own or {})}


def config(entry: Mapping[str, Any], where: Path) -> EncoderConfig:
    """The manifest's config, every field checked: a size of 0, heads that do not divide d_model or an unknown
    field is a load failure naming it, never a ZeroDivisionError in the warm-up or a request's 500."""
    raw = entry.get("config")
    known = sorted(f.name for f in dataclasses.fields(EncoderConfig))
    if not isinstance(raw, dict) or set(raw) - set(known):
        raise ModelLoadError(f"{where}: config {shown(raw)}; an encoder's config has {', '.join(known)}")
    sizes = {k: positive_int(raw, k, where) for k in ("d_model", "num_heads", "d_ff", "num_layers")}
    sizes["max_sequence_length"] = positive_int(raw, "max_sequence_length", where)
    if sizes["d_model"] % sizes["num_heads"]:
        raise ModelLoadError(
            f"{where}: config.num_heads {sizes['num_heads']} does not divide config.d_model {sizes['d_model']}"
        )
    if not isinstance(raw.get("norm_first"), bool):
        raise ModelLoadError(f"{where}: config.norm_first {shown(raw.get('norm_first'))}; expected true or false")
    fields: dict[str, Any] = {**sizes, "norm_first": raw["norm_first"], "eps": positive_float(raw, "eps", where, 1e-5)}
    return EncoderConfig(**fields, **_architecture(raw, where))


def _architecture(raw: Mapping[str, Any], where: Path) -> dict[str, Any]:
    """The fields a user's model adds (activation, positional encoding, bias, final norm); absent, the defaults'."""
    default = EncoderConfig()
    chosen = {
        "activation": (raw.get("activation", default.activation), tuple(reference.ACTIVATIONS)),
        "positional_encoding": (raw.get("positional_encoding", default.positional_encoding), POSITIONAL_ENCODINGS),
        "bias": (raw.get("bias", default.bias), (True, False)),
        "final_norm": (raw.get("final_norm", default.final_norm), (True, False, None)),
    }
    for key, (value, allowed) in chosen.items():
        if not any(value is a if isinstance(a, bool) or a is None else value == a for a in allowed):
            expected = ", ".join("null" if a is None else str(a).lower() if isinstance(a, bool) else a for a in allowed)
            raise ModelLoadError(f"{where}: config.{key} {shown(value)}; expected one of {expected}")
    fields = {key: value for key, (value, _) in chosen.items()}
    final_eps = raw.get("final_eps")
    fields["final_eps"] = None if final_eps is None else positive_float(raw, "final_eps", where, 1e-5)
    return fields
