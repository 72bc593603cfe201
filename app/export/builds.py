"""One version's files in its staged folder: the ONNX graph, weights.npz, and the manifest's fields measured on them.

Each builder exports the module, reloads the file as the server will, measures parity (ONNX vs torch,
ONNX vs the float64 NumPy reference) and raises ParityError beyond the tolerance: nothing lands then.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

import app
from app.core import encoder as encoder_kind
from app.core import layernorm as layernorm_kind
from app.core.reference import EncoderConfig, layer_norm_names
from app.core.repository import MODEL_FILE, WEIGHTS_FILE
from app.export import baselines, graph, parity
from app.export.graph import ExportError
from app.export.modules import Encoder, RowLayerNorm

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Inputs like the traffic to come (--calibration), the baseline's source instead of the parity inputs."""

    array: np.ndarray
    description: str


class ParityError(ExportError):
    """ONNX outputs that differ from PyTorch or the NumPy reference beyond the tolerance."""


def architecture(cfg: EncoderConfig, source: Mapping[str, Any]) -> str:
    """One line of what was built: the manifest's config, in words."""
    final = f"final norm (eps {cfg.final_eps if cfg.final_eps is not None else cfg.eps:g})"
    layout = "" if source.get("batch_first", True) else ", batch_first=False (served batch first)"
    return (
        f"{source['class']}: {cfg.num_layers} layers, d_model {cfg.d_model}, {cfg.num_heads} heads, d_ff {cfg.d_ff}, "
        f"{cfg.activation}, {'pre' if cfg.norm_first else 'post'}-LN, eps {cfg.eps:g}, "
        f"{final if cfg.has_final_norm else 'no final norm'}, {'bias' if cfg.bias else 'bias=False'}, "
        f"positional encoding {cfg.positional_encoding}{layout}"
    )


def build_layernorm(
    folder: Path,
    name: str,
    learned: torch.nn.LayerNorm | None,
    opset: int,
    tolerance: float,
    say: Progress,
    calibration: Calibration | None = None,
) -> dict[str, Any]:
    """The one layernorm graph (gamma, beta and eps are inputs); a learned one adds weights.npz and its eps.

    The baseline: calibration's rows, else the seeded N(0,1) parity inputs (a learned one's at scale 1 only:
    its x10 and x0.1 parity inputs are there to test the arithmetic, not to look like traffic).
    """
    shape = "" if learned is None else f", normalized_shape {list(learned.normalized_shape)}"
    say(f"exporting {name} (layernorm{shape}, opset {opset}) ...")
    module = RowLayerNorm().eval()
    example = (torch.zeros(4, 8), torch.ones(8), torch.zeros(8), torch.full((4, 1), 1e-5), torch.zeros(4, 1))
    proto = graph.to_onnx(module, example, layernorm_kind.INPUTS, layernorm_kind.OUTPUTS, {}, opset)
    manifest = {"kind": "layernorm", **graph.write_onnx(folder, proto), **provenance()}
    session = graph.load_session(folder / MODEL_FILE, layernorm_kind.INPUTS, layernorm_kind.OUTPUTS)
    if learned is None:
        manifest["config"] = {}
        figures = parity.layernorm_parity(session, module)
    else:
        gamma, beta = gamma_beta(learned)
        graph.save_npz(folder / WEIGHTS_FILE, {"gamma": gamma, "beta": beta})
        manifest["config"] = {
            "normalized_shape": list(learned.normalized_shape),
            "eps": learned.eps,
            "elementwise_affine": learned.weight is not None,
            "bias": learned.bias is not None,
        }
        figures = parity.learned_layernorm_parity(session, learned, gamma, beta)
    manifest["parity"] = _check_parity(name, *figures, tolerance, say)
    manifest["baseline"] = _layernorm_baseline(learned, calibration)
    return manifest


def _layernorm_baseline(learned: torch.nn.LayerNorm | None, calibration: Calibration | None) -> dict[str, Any]:
    if calibration is not None:
        size = calibration.array.shape[-1] if learned is None else int(np.prod(learned.normalized_shape))
        rows, inputs = [calibration.array.reshape(-1, size)], calibration.description
    elif learned is None:
        cases = [c for c in parity.layernorm_cases() if not c.id.startswith("seed")]  # not the hand-made goldens
        rows, inputs = [parity.layernorm_feeds(c)["input"] for c in cases], "the seeded N(0,1) parity inputs' rows"
    else:
        x = parity.learned_layernorm_inputs(tuple(learned.normalized_shape))[(5,)]
        rows, inputs = [x.reshape(len(x), -1)], "the seeded N(0,1) parity input [5,...] at scale 1, by row"
    return baselines.manifest_entry(baselines.layernorm_stats(rows), inputs)


def gamma_beta(learned: torch.nn.LayerNorm) -> tuple[np.ndarray, np.ndarray]:
    """The module's weight and bias, or the 1 and 0 that elementwise_affine=False and bias=False leave out."""
    shape = tuple(learned.normalized_shape)
    gamma = np.ones(shape, np.float32) if learned.weight is None else learned.weight.detach().numpy()
    beta = np.zeros(shape, np.float32) if learned.bias is None else learned.bias.detach().numpy()
    return gamma, beta


def build_encoder(
    folder: Path,
    name: str,
    model: Encoder,
    opset: int,
    tolerance: float,
    say: Progress,
    against: parity.Forward | None = None,
    calibration: Calibration | None = None,
) -> dict[str, Any]:
    """The encoder's graph, weights.npz, parity, and each LayerNorm's baseline (calibration, else the parity inputs)."""
    cfg = model.cfg
    say(f"exporting {name} ({'pre' if cfg.norm_first else 'post'}-LN, d_model {cfg.d_model}, opset {opset}) ...")
    # Example sizes above 1 on both axes: torch.export specializes dims it sees as 0 or 1.
    T = min(5, cfg.max_sequence_length)
    example = (torch.zeros(2, T, cfg.d_model), torch.zeros(2, T, dtype=torch.bool))
    inputs, outputs = encoder_kind.signature(cfg)
    proto = graph.to_onnx(model, example, inputs, outputs, {"seq": cfg.max_sequence_length}, opset)
    manifest = {"kind": "encoder", **graph.write_onnx(folder, proto), **provenance()}
    session = graph.load_session(folder / MODEL_FILE, inputs, outputs)
    weights = {key: value.detach().numpy() for key, value in model.state_dict().items()}
    graph.save_npz(folder / WEIGHTS_FILE, weights)
    manifest["config"] = dataclasses.asdict(cfg)
    manifest["layer_norms"] = layer_norm_names(cfg)
    figures = parity.encoder_parity(session, model, weights, against)
    manifest["parity"] = _check_parity(name, *figures, tolerance, say)
    if calibration is None:
        cases: list[tuple[np.ndarray, np.ndarray | None]] = list(
            parity.encoder_cases(cfg.d_model, cfg.max_sequence_length)
        )
        measured_on = "the parity inputs (parity.inputs), at unpadded positions"
    else:
        cases, measured_on = [(calibration.array, None)], calibration.description
    manifest["baseline"] = baselines.manifest_entry(baselines.encoder_stats(cases, weights, cfg), measured_on)
    return manifest


def provenance() -> dict[str, Any]:
    versions = {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": ort.__version__}
    return {"normserve": app.__version__, "versions": versions | {"numpy": np.__version__}}


def _check_parity(
    name: str, vs_torch: float, vs_numpy: float, description: str, tolerance: float, say: Progress
) -> dict[str, Any]:
    say(f"parity {name}: torch {vs_torch:.1e} numpy {vs_numpy:.1e} (tolerance {tolerance:.0e})")
    if not (vs_torch <= tolerance and vs_numpy <= tolerance):  # also catches NaN
        raise ParityError(
            f"parity failed for {name}: onnx vs torch {vs_torch:.3e}, onnx vs numpy {vs_numpy:.3e}, "
            f"tolerance {tolerance:.0e}; nothing written"
        )
    return {"onnx_vs_torch": vs_torch, "onnx_vs_numpy": vs_numpy, "tolerance": tolerance, "inputs": description}
