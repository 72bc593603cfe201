"""Export models to ONNX into the model repository, each checked three ways (ONNX, PyTorch, NumPy) before it lands.

`normserve export` writes the three default models as version 1 of each (replacing it);
`normserve export encoder|layernorm --name NAME` writes a user's trained model as the next version
of NAME. Every version is staged and renamed into place whole (app/export/versions.py), and only
once every model of the command has passed onnx.checker and parity: otherwise nothing lands.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from app.core.repository import MANIFEST, MODEL_FILE, WEIGHTS_FILE
from app.export import checks, graph, options, parity, sources, versions
from app.export.checkpoints import check_config, load_encoder, load_layernorm
from app.export.graph import ExportError
from app.export.modules import CheckpointError, Encoder, RowLayerNorm, load_checkpoint, seeded_encoder

MIN_OPSET = 18
DEFAULT_VERSION = 1  # the default models are always version 1: a re-export replaces it

Progress = Callable[[str], None]


class ParityError(ExportError):
    """ONNX outputs that differ from PyTorch or the NumPy reference beyond the tolerance."""


@dataclasses.dataclass(frozen=True)
class Exported:
    """One version written: where, and its manifest.json as written."""

    name: str
    version: int
    folder: Path
    manifest: dict[str, Any]


def export_defaults(
    repository: Path,
    *,
    checkpoint: Path | None = None,
    checkpoint_preln: Path | None = None,
    config: EncoderConfig = EncoderConfig(),  # noqa: B008 - frozen dataclass, safe as a default
    seed: int = 0,
    opset: int = 18,
    tolerance: float = 1e-4,
    progress: Progress | None = None,
) -> list[Exported]:
    """layernorm, encoder (post-LN) and encoder-preln as version 1 each, replacing it; all or none land.

    checkpoint / checkpoint_preln are state_dict files of normserve's Encoder (default: seeded weights).
    """
    say = progress or (lambda _message: None)
    _check_opset(opset)
    check_config(config)
    encoders = {
        "encoder": _default_encoder(dataclasses.replace(config, norm_first=False), checkpoint, seed),
        "encoder-preln": _default_encoder(dataclasses.replace(config, norm_first=True), checkpoint_preln, seed),
    }
    root = Path(repository)
    with _writing(root, say), contextlib.ExitStack() as stack:
        staged = {name: stack.enter_context(versions.staging(root, name)) for name in ("layernorm", *encoders)}
        manifests = {"layernorm": _build_layernorm(staged["layernorm"], "layernorm", None, opset, tolerance, say)}
        for name, model in encoders.items():
            manifests[name] = _build_encoder(staged[name], name, model, opset, tolerance, say)
        exported = [_commit(root, name, staged[name], m, DEFAULT_VERSION) for name, m in manifests.items()]
    say(f"wrote {', '.join(f'{e.name}/{e.version}' for e in exported)} to {root}")
    return exported


def export_encoder(
    repository: Path,
    name: str,
    checkpoint: Path | None = None,
    *,
    module: Path | None = None,
    sizes: Mapping[str, Any] | None = None,
    check: checks.CheckPair | None = None,
    opset: int = 18,
    tolerance: float = 1e-4,
    progress: Progress | None = None,
) -> Exported:
    """A trained encoder as the next version of name: a whole module (--module) or a state_dict (--checkpoint).

    sizes: EncoderConfig fields given by flags (a state_dict's heads, activation, ...); the others are read
    from the checkpoint (checkpoints.py) or the module (sources.py), whose own forward parity is measured against.
    """
    say = progress or (lambda _message: None)
    _check_opset(opset)
    given = {k: v for k, v in (sizes or {}).items() if v is not None}
    if module is not None:
        max_len = given.get("max_sequence_length", EncoderConfig().max_sequence_length)
        user = sources.user_encoder(sources.load_module(module), module, max_len, given.get("positional_encoding"))
        model, against, source = user.twin, user.forward, user.source
    elif checkpoint is not None:
        model, against, source = load_encoder(Path(checkpoint), given), None, {"class": "state_dict"}
    else:
        raise ValueError("export_encoder needs a module or a checkpoint")
    check_config(model.cfg)
    say(f"architecture of {name}: {architecture(model.cfg, source)}")
    root = Path(repository)
    with _writing(root, say), versions.staging(root, name) as folder:
        manifest = _build_encoder(folder, name, model, opset, tolerance, say, against)
        manifest["source"] = source
        if check is not None:
            session = ort.InferenceSession(str(folder / MODEL_FILE), providers=["CPUExecutionProvider"])
            manifest["check"] = checks.check_encoder(session, check, tolerance)
            say(
                f"check {name}: {manifest['check']['max_abs_diff']:.1e} from {check.output} (tolerance {tolerance:.0e})"
            )
        return _commit(root, name, folder, manifest, None)


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


def export_layernorm(
    repository: Path,
    name: str,
    checkpoint: Path | None = None,
    *,
    module: Path | None = None,
    eps: float | None = None,
    check: checks.CheckPair | None = None,
    opset: int = 18,
    tolerance: float = 1e-4,
    progress: Progress | None = None,
) -> Exported:
    """A trained torch.nn.LayerNorm as the next version of name: the default graph, with its gamma, beta and eps."""
    say = progress or (lambda _message: None)
    _check_opset(opset)
    if module is not None:
        learned = sources.user_layernorm(sources.load_module(module), module)
    elif checkpoint is not None:
        learned = _layernorm_from_state(Path(checkpoint), options.DEFAULT_EPS if eps is None else eps)
    else:
        raise ValueError("export_layernorm needs a module or a checkpoint")
    if not learned.eps > 0:
        raise ValueError(f"eps must be positive, got {learned.eps}")
    root = Path(repository)
    with _writing(root, say), versions.staging(root, name) as folder:
        manifest = _build_layernorm(folder, name, learned.eval(), opset, tolerance, say)
        if check is not None:
            session = graph.load_session(folder / MODEL_FILE, layernorm_kind.INPUTS, layernorm_kind.OUTPUTS)
            manifest["check"] = checks.check_layernorm(session, learned, check, tolerance)
        return _commit(root, name, folder, manifest, None)


def _layernorm_from_state(checkpoint: Path, eps: float) -> torch.nn.LayerNorm:
    gamma, beta = load_layernorm(checkpoint)
    module = torch.nn.LayerNorm(gamma.shape, eps=eps, bias=True)
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(gamma))
        module.bias.copy_(torch.from_numpy(beta))
    return module


@contextlib.contextmanager
def _writing(root: Path, say: Progress) -> Iterator[None]:
    """The repository ready (created, or migrated from the old layout); a repository this created goes if it fails."""
    created = not root.exists()
    versions.prepare(root, say)
    try:
        yield
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                root.rmdir()  # only when empty: the staged folders are gone by now
        raise


def _commit(root: Path, name: str, folder: Path, manifest: dict[str, Any], version: int | None) -> Exported:
    version = versions.commit(root, name, folder, manifest, version)
    target = root / name / str(version)
    return Exported(name, version, target, json.loads((target / MANIFEST).read_text()))


def _check_opset(opset: int) -> None:
    if opset < MIN_OPSET:  # torch 2.13 builds opset-18 graphs; converted down, Split keeps an opset-18 attribute
        raise ValueError(f"opset {opset} is not supported: torch {torch.__version__} exports {MIN_OPSET} or newer")


def _default_encoder(cfg: EncoderConfig, checkpoint: Path | None, seed: int) -> Encoder:
    model = seeded_encoder(cfg, seed)
    if checkpoint is not None:
        load_checkpoint(model, checkpoint)
    return model


def _build_layernorm(
    folder: Path, name: str, learned: torch.nn.LayerNorm | None, opset: int, tolerance: float, say: Progress
) -> dict[str, Any]:
    """The one layernorm graph (gamma, beta and eps are inputs); a learned one adds weights.npz and its eps."""
    shape = "" if learned is None else f", normalized_shape {list(learned.normalized_shape)}"
    say(f"exporting {name} (layernorm{shape}, opset {opset}) ...")
    module = RowLayerNorm().eval()
    example = (torch.zeros(4, 8), torch.ones(8), torch.zeros(8), torch.full((4, 1), 1e-5), torch.zeros(4, 1))
    proto = graph.to_onnx(module, example, layernorm_kind.INPUTS, layernorm_kind.OUTPUTS, {}, opset)
    manifest = {"kind": "layernorm", **graph.write_onnx(folder, proto), **_provenance()}
    session = graph.load_session(folder / MODEL_FILE, layernorm_kind.INPUTS, layernorm_kind.OUTPUTS)
    if learned is None:
        manifest["config"] = {}
        figures = parity.layernorm_parity(session, module)
    else:
        gamma, beta = _gamma_beta(learned)
        graph.save_npz(folder / WEIGHTS_FILE, {"gamma": gamma, "beta": beta})
        manifest["config"] = {
            "normalized_shape": list(learned.normalized_shape),
            "eps": learned.eps,
            "elementwise_affine": learned.weight is not None,
            "bias": learned.bias is not None,
        }
        figures = parity.learned_layernorm_parity(session, learned, gamma, beta)
    manifest["parity"] = _check_parity(name, *figures, tolerance, say)
    return manifest


def _gamma_beta(learned: torch.nn.LayerNorm) -> tuple[np.ndarray, np.ndarray]:
    """The module's weight and bias, or the 1 and 0 that elementwise_affine=False and bias=False leave out."""
    shape = tuple(learned.normalized_shape)
    gamma = np.ones(shape, np.float32) if learned.weight is None else learned.weight.detach().numpy()
    beta = np.zeros(shape, np.float32) if learned.bias is None else learned.bias.detach().numpy()
    return gamma, beta


def _build_encoder(
    folder: Path,
    name: str,
    model: Encoder,
    opset: int,
    tolerance: float,
    say: Progress,
    against: parity.Forward | None = None,
) -> dict[str, Any]:
    cfg = model.cfg
    say(f"exporting {name} ({'pre' if cfg.norm_first else 'post'}-LN, d_model {cfg.d_model}, opset {opset}) ...")
    # Example sizes above 1 on both axes: torch.export specializes dims it sees as 0 or 1.
    T = min(5, cfg.max_sequence_length)
    example = (torch.zeros(2, T, cfg.d_model), torch.zeros(2, T, dtype=torch.bool))
    inputs, outputs = encoder_kind.signature(cfg)
    proto = graph.to_onnx(model, example, inputs, outputs, {"seq": cfg.max_sequence_length}, opset)
    manifest = {"kind": "encoder", **graph.write_onnx(folder, proto), **_provenance()}
    session = graph.load_session(folder / MODEL_FILE, inputs, outputs)
    weights = {key: value.detach().numpy() for key, value in model.state_dict().items()}
    graph.save_npz(folder / WEIGHTS_FILE, weights)
    manifest["config"] = dataclasses.asdict(cfg)
    manifest["layer_norms"] = layer_norm_names(cfg)
    figures = parity.encoder_parity(session, model, weights, against)
    manifest["parity"] = _check_parity(name, *figures, tolerance, say)
    return manifest


def _provenance() -> dict[str, Any]:
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


def main(argv: Sequence[str] | None = None, progress: Progress | None = None) -> int:
    """`normserve export`: progress on stderr (or to `progress`); on any failure one line of error, exit status 1."""
    return run(options.parse_args(argv), progress)


def run(args: argparse.Namespace, progress: Progress | None = None) -> int:
    """main on flags already parsed (by app.export.options, which the CLI reads before torch is imported).

    Prints `exported NAME version V to FOLDER` on stdout for each version written.
    """
    say = progress or (lambda message: print(message, file=sys.stderr, flush=True))
    common: dict[str, Any] = {"opset": args.opset, "tolerance": args.tolerance, "progress": say}
    try:
        if args.kind is not None:
            options.check_source_flags(args)
            common |= {"module": args.module, "check": checks.from_args(args)}
        if args.kind == "encoder":
            sizes = options.encoder_sizes(args)
            exported = [export_encoder(args.repository, args.name, args.checkpoint, sizes=sizes, **common)]
        elif args.kind == "layernorm":
            exported = [export_layernorm(args.repository, args.name, args.checkpoint, eps=args.eps, **common)]
        else:
            exported = export_defaults(
                args.repository,
                checkpoint=args.checkpoint,
                checkpoint_preln=args.checkpoint_preln,
                config=options.config(args),
                seed=args.seed,
                **common,
            )
    except (ExportError, ValueError, OSError) as e:  # CheckpointError is a ValueError
        print(f"normserve export: error: {e}", file=sys.stderr)
        return 1
    for done in exported:
        print(f"exported {done.name} version {done.version} to {done.folder}", flush=True)
    return 0


__all__ = [
    "CheckpointError",
    "ExportError",
    "Exported",
    "ParityError",
    "export_defaults",
    "export_encoder",
    "export_layernorm",
    "main",
    "run",
]
