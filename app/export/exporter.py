"""Export the LayerNorm and encoder models to ONNX, check them three ways, and write them with a manifest."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
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
from app.export import graph, options, parity
from app.export.graph import ExportError
from app.export.modules import CheckpointError, Encoder, RowLayerNorm, load_checkpoint, seeded_encoder

FORMAT_VERSION = 1
MIN_OPSET = 18

Progress = Callable[[str], None]


class ParityError(ExportError):
    """ONNX outputs that differ from PyTorch or the NumPy reference beyond the tolerance."""


def export_models(
    out_dir: Path,
    *,
    checkpoint: Path | None = None,
    checkpoint_preln: Path | None = None,
    config: EncoderConfig = EncoderConfig(),  # noqa: B008 - frozen dataclass, safe as a default
    seed: int = 0,
    opset: int = 18,
    tolerance: float = 1e-4,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Export layernorm, encoder (post-LN) and encoder-preln into out_dir with manifest.json; return the manifest.

    Everything is written to a temporary directory first and moved into out_dir only once every model has
    passed onnx.checker and ORT-vs-torch and ORT-vs-NumPy parity; otherwise out_dir is left untouched.
    checkpoint / checkpoint_preln are state_dict files for the two encoders (default: seeded weights).
    """
    say = progress or (lambda _message: None)
    _check_config(config, opset)
    encoders = {
        "encoder": _build_encoder(dataclasses.replace(config, norm_first=False), checkpoint, seed),
        "encoder-preln": _build_encoder(dataclasses.replace(config, norm_first=True), checkpoint_preln, seed),
    }
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # A sibling of out_dir, so that the final os.replace stays on one filesystem.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-export-", dir=out_dir.parent))
    try:
        models = {"layernorm": _export_layernorm(tmp, opset, tolerance, say)}
        for name, model in encoders.items():
            models[name] = _export_encoder(tmp, name, model, opset, tolerance, say)
        manifest = _write_manifest(tmp, models)
        graph.move_into_place(tmp, out_dir)
        say(f"wrote {', '.join(models)} and manifest.json to {out_dir}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _write_manifest(tmp: Path, models: dict[str, Any]) -> dict[str, Any]:
    versions = {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": ort.__version__}
    versions["numpy"] = np.__version__
    manifest = {"format_version": FORMAT_VERSION, "normserve": app.__version__, "versions": versions, "models": models}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _check_config(cfg: EncoderConfig, opset: int) -> None:
    if opset < MIN_OPSET:  # torch 2.13 builds opset-18 graphs; converted down, Split keeps an opset-18 attribute
        raise ValueError(f"opset {opset} is not supported: torch {torch.__version__} exports {MIN_OPSET} or newer")
    if cfg.d_model % 2 or cfg.d_model % cfg.num_heads:
        raise ValueError(f"d_model {cfg.d_model} must be even and divisible by num_heads {cfg.num_heads}")
    if min(cfg.d_ff, cfg.num_layers) < 1 or cfg.max_sequence_length < 2 or cfg.eps <= 0:
        raise ValueError(f"d_ff, num_layers and eps must be positive and max_sequence_length at least 2: {cfg}")


def _build_encoder(cfg: EncoderConfig, checkpoint: Path | None, seed: int) -> Encoder:
    model = seeded_encoder(cfg, seed)
    if checkpoint is not None:
        load_checkpoint(model, checkpoint)
    return model


def _export_layernorm(tmp: Path, opset: int, tolerance: float, say: Progress) -> dict[str, Any]:
    say(f"exporting layernorm (opset {opset}) ...")
    module = RowLayerNorm().eval()
    example = (torch.zeros(4, 8), torch.ones(8), torch.zeros(8), torch.full((4, 1), 1e-5), torch.zeros(4, 1))
    proto = graph.to_onnx(module, example, layernorm_kind.INPUTS, layernorm_kind.OUTPUTS, {}, opset)
    entry = graph.write_onnx(tmp, "layernorm", "layernorm", proto)
    session = graph.load_session(tmp / entry["file"], layernorm_kind.INPUTS, layernorm_kind.OUTPUTS)
    entry["config"] = {}
    entry["parity"] = _check_parity("layernorm", *parity.layernorm_parity(session, module), tolerance, say)
    return entry


def _export_encoder(
    tmp: Path, name: str, model: Encoder, opset: int, tolerance: float, say: Progress
) -> dict[str, Any]:
    cfg = model.cfg
    say(f"exporting {name} ({'pre' if cfg.norm_first else 'post'}-LN, opset {opset}) ...")
    # Example sizes above 1 on both axes: torch.export specializes dims it sees as 0 or 1.
    T = min(5, cfg.max_sequence_length)
    example = (torch.zeros(2, T, cfg.d_model), torch.zeros(2, T, dtype=torch.bool))
    inputs, outputs = encoder_kind.signature(cfg)
    proto = graph.to_onnx(model, example, inputs, outputs, {"seq": cfg.max_sequence_length}, opset)
    entry = graph.write_onnx(tmp, name, "encoder", proto)
    session = graph.load_session(tmp / entry["file"], inputs, outputs)
    weights = {key: value.detach().numpy() for key, value in model.state_dict().items()}
    weights_file = tmp / f"{name}.npz"
    graph.save_npz(weights_file, weights)
    entry["config"] = dataclasses.asdict(cfg)
    entry["weights"] = {"file": weights_file.name, "sha256": graph.sha256(weights_file)}
    entry["layer_norms"] = layer_norm_names(cfg)
    entry["parity"] = _check_parity(name, *parity.encoder_parity(session, model, weights), tolerance, say)
    return entry


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


def main(argv: Sequence[str] | None = None, progress: Progress | None = None) -> int:
    """`normserve export`: progress on stderr (or to `progress`); on any failure one line of error, exit status 1."""
    return run(options.parse_args(argv), progress)


def run(args: argparse.Namespace, progress: Progress | None = None) -> int:
    """main on flags already parsed (by app.export.options, which the CLI reads before torch is imported)."""
    try:
        export_models(
            args.out_dir,
            checkpoint=args.checkpoint,
            checkpoint_preln=args.checkpoint_preln,
            config=options.config(args),
            seed=args.seed,
            opset=args.opset,
            tolerance=args.tolerance,
            progress=progress or (lambda message: print(message, file=sys.stderr, flush=True)),
        )
    except (ExportError, ValueError, OSError) as e:  # CheckpointError is a ValueError
        print(f"normserve export: error: {e}", file=sys.stderr)
        return 1
    return 0


__all__ = ["CheckpointError", "ExportError", "ParityError", "export_models", "main", "run"]
