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

import onnxruntime as ort
import torch

from app.core import layernorm as layernorm_kind
from app.core.reference import EncoderConfig
from app.core.repository import MANIFEST, MODEL_FILE
from app.export import baselines, builds, checks, graph, options, parity, sources, versions
from app.export.builds import Calibration, ParityError
from app.export.checkpoints import check_config, load_encoder, load_layernorm
from app.export.graph import ExportError
from app.export.modules import CheckpointError, Encoder, load_checkpoint, seeded_encoder

MIN_OPSET = 18
DEFAULT_VERSION = 1  # the default models are always version 1: a re-export replaces it

Progress = Callable[[str], None]


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
    check_opset(opset)
    check_config(config)
    encoders = {
        "encoder": _default_encoder(dataclasses.replace(config, norm_first=False), checkpoint, seed),
        "encoder-preln": _default_encoder(dataclasses.replace(config, norm_first=True), checkpoint_preln, seed),
    }
    root = Path(repository)
    with writing(root, say), contextlib.ExitStack() as stack:
        staged = {name: stack.enter_context(versions.staging(root, name)) for name in ("layernorm", *encoders)}
        manifests = {"layernorm": builds.build_layernorm(staged["layernorm"], "layernorm", None, opset, tolerance, say)}
        for name, model in encoders.items():
            manifests[name] = builds.build_encoder(staged[name], name, model, opset, tolerance, say)
        exported = [commit_version(root, name, staged[name], m, DEFAULT_VERSION) for name, m in manifests.items()]
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
    calibration: Path | None = None,
    opset: int = 18,
    tolerance: float = 1e-4,
    progress: Progress | None = None,
) -> Exported:
    """A trained encoder as the next version of name: a whole module (--module) or a state_dict (--checkpoint).

    sizes: EncoderConfig fields given by flags (a state_dict's heads, activation, ...); the others are read
    from the checkpoint (checkpoints.py) or the module (sources.py), whose own forward parity is measured against.
    calibration: a (batch, seq, d_model) .npy like the traffic to come, the drift monitor's baseline.
    """
    say = progress or (lambda _message: None)
    check_opset(opset)
    model, against, source = _read_encoder(
        module, checkpoint, {k: v for k, v in (sizes or {}).items() if v is not None}
    )
    check_config(model.cfg)
    inputs = None if calibration is None else _encoder_calibration(calibration, model.cfg)
    say(f"architecture of {name}: {builds.architecture(model.cfg, source)}")
    if "note" in source:
        say(f"note: {source['note']}")
    if checkpoint is not None and module is None and check is None:
        say(f"note: {state_dict_note(model.cfg)}")
    root = Path(repository)
    with writing(root, say), versions.staging(root, name) as folder:
        manifest = builds.build_encoder(folder, name, model, opset, tolerance, say, against, inputs)
        manifest["source"] = source
        if check is not None:
            session = ort.InferenceSession(str(folder / MODEL_FILE), providers=["CPUExecutionProvider"])
            record = manifest["check"] = checks.check_encoder(session, check, tolerance)
            say(f"check {name}: {record['max_abs_diff']:.1e} from {check.output} (tolerance {tolerance:.0e})")
        return commit_version(root, name, folder, manifest, None)


def state_dict_note(cfg: EncoderConfig) -> str:
    """What a state_dict export took on trust: a wrong but divisible --num-heads still passes parity, measured
    against the twin built from the same flags, and serves a model that computes something else."""
    placement = "pre-LN" if cfg.norm_first else "post-LN"
    return (
        f"a state_dict does not record the heads, the activation or the norm placement: {cfg.num_heads} heads, "
        f"{cfg.activation} and {placement} are taken from the flags (--num-heads, --activation, --pre-ln/--post-ln); "
        "to check them against your module, pass --check-input X.npy --check-output Y.npy, an input and the output "
        "your module gave for it"
    )


def _encoder_calibration(path: Path, cfg: EncoderConfig) -> Calibration:
    shape = f"(batch, seq <= {cfg.max_sequence_length}, {cfg.d_model})"
    array = baselines.load_calibration(path, shape, 3, (cfg.d_model,))
    if array.shape[1] > cfg.max_sequence_length:
        raise ValueError(f"--calibration {path}: expected a float array {shape}, got shape {list(array.shape)}")
    return Calibration(array, f"--calibration {path.name} {list(array.shape)}")


def _read_encoder(
    module: Path | None, checkpoint: Path | None, given: Mapping[str, Any]
) -> tuple[Encoder, parity.Forward | None, dict[str, Any]]:
    """The twin to export, the user's module to measure it against (a state_dict has none), and the source."""
    if module is not None:
        max_len = given.get("max_sequence_length", EncoderConfig().max_sequence_length)
        user = sources.user_encoder(sources.load_module(module), module, max_len, given.get("positional_encoding"))
        return user.twin, user.forward, user.source
    if checkpoint is not None:
        return load_encoder(Path(checkpoint), given), None, {"class": "state_dict"}
    raise ValueError("export_encoder needs a module or a checkpoint")


def export_layernorm(
    repository: Path,
    name: str,
    checkpoint: Path | None = None,
    *,
    module: Path | None = None,
    eps: float | None = None,
    check: checks.CheckPair | None = None,
    calibration: Path | None = None,
    opset: int = 18,
    tolerance: float = 1e-4,
    progress: Progress | None = None,
) -> Exported:
    """A trained torch.nn.LayerNorm as the next version of name: the default graph, with its gamma, beta and eps.

    calibration: a .npy ending in the normalized_shape like the traffic to come, the drift monitor's baseline.
    """
    say = progress or (lambda _message: None)
    check_opset(opset)
    if module is not None:
        learned = sources.user_layernorm(sources.load_module(module), module)
    elif checkpoint is not None:
        learned = _layernorm_from_state(Path(checkpoint), options.DEFAULT_EPS if eps is None else eps)
    else:
        raise ValueError("export_layernorm needs a module or a checkpoint")
    if not learned.eps > 0:
        raise ValueError(f"eps must be positive, got {learned.eps}")
    inputs = None if calibration is None else _layernorm_calibration(calibration, tuple(learned.normalized_shape))
    root = Path(repository)
    with writing(root, say), versions.staging(root, name) as folder:
        manifest = builds.build_layernorm(folder, name, learned.eval(), opset, tolerance, say, inputs)
        if check is not None:
            session = graph.load_session(folder / MODEL_FILE, layernorm_kind.INPUTS, layernorm_kind.OUTPUTS)
            manifest["check"] = checks.check_layernorm(session, learned, check, tolerance)
        return commit_version(root, name, folder, manifest, None)


def _layernorm_calibration(path: Path, normalized: tuple[int, ...]) -> Calibration:
    array = baselines.load_calibration(path, f"(..., {', '.join(map(str, normalized))})", None, normalized)
    return Calibration(array, f"--calibration {path.name} {list(array.shape)}, by row")


def _layernorm_from_state(checkpoint: Path, eps: float) -> torch.nn.LayerNorm:
    gamma, beta = load_layernorm(checkpoint)
    module = torch.nn.LayerNorm(gamma.shape, eps=eps, bias=True)
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(gamma))
        module.bias.copy_(torch.from_numpy(beta))
    return module


@contextlib.contextmanager
def writing(root: Path, say: Progress) -> Iterator[None]:
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


def commit_version(root: Path, name: str, folder: Path, manifest: dict[str, Any], version: int | None) -> Exported:
    version = versions.commit(root, name, folder, manifest, version)
    target = root / name / str(version)
    return Exported(name, version, target, json.loads((target / MANIFEST).read_text()))


def check_opset(opset: int) -> None:
    if opset < MIN_OPSET:  # torch 2.13 builds opset-18 graphs; converted down, Split keeps an opset-18 attribute
        raise ValueError(f"opset {opset} is not supported: torch {torch.__version__} exports {MIN_OPSET} or newer")


def _default_encoder(cfg: EncoderConfig, checkpoint: Path | None, seed: int) -> Encoder:
    model = seeded_encoder(cfg, seed)
    if checkpoint is not None:
        load_checkpoint(model, checkpoint)
    return model


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
        if args.kind == options.TEXT_ENCODER:
            from app.export.textexport import export_text_encoder  # transformers, imported for this command alone

            head = {"max_seq_length": args.max_sequence_length, "pooling": args.pooling, "normalize": args.normalize}
            text = {"check_texts": args.check_texts, "calibration": args.calibration, **head}
            text |= {"version": args.version, "quantize": args.quantize, "optimize": args.optimize}
            exported = [export_text_encoder(args.repository, args.name, args.hf, **text, **common)]
        elif args.kind == "encoder":
            sizes = options.encoder_sizes(args)
            common |= {"module": args.module, "check": checks.from_args(args), "calibration": args.calibration}
            exported = [export_encoder(args.repository, args.name, args.checkpoint, sizes=sizes, **common)]
        elif args.kind == "layernorm":
            common |= {"module": args.module, "check": checks.from_args(args), "calibration": args.calibration}
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
