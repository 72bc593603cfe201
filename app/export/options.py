"""`normserve export`'s options, with no torch: `--help` and bad flags answer on an install without the export extra.

Three commands share the name: `normserve export` (the three default models, version 1 each),
`normserve export encoder` and `normserve export layernorm` (a user's checkpoint, as the next version of
its name). The first word picks the parser, rather than argparse subparsers: the defaults' flags
(--checkpoint, --d-model ...) have other meanings in the kinds' commands, and a subparser's defaults
would overwrite them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from app.core.reference import EncoderConfig
from app.core.repository import NAME

CONFIG_FLAGS = ("d_model", "num_heads", "d_ff", "num_layers", "max_sequence_length")  # --d-model ...
KINDS = ("encoder", "layernorm")
DEFAULT_EPS = 1e-5  # torch.nn.LayerNorm's: a checkpoint does not hold eps (the module does)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The flags of whichever command argv[0] names; `kind` is None for the defaults, else encoder or layernorm."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in KINDS:
        parser = _encoder_parser() if argv[0] == "encoder" else _layernorm_parser()
        return parser.parse_args(argv[1:], argparse.Namespace(kind=argv[0]))
    return _defaults_parser().parse_args(argv, argparse.Namespace(kind=None))


def _defaults_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="normserve export",
        description="Export the default models (layernorm, encoder, encoder-preln) as version 1 of each, replacing "
        "it; nothing is written if a model fails onnx.checker or parity against PyTorch and NumPy. "
        "A repository in the old layout (a top-level manifest.json) is migrated first.",
        epilog="A trained model of your own: `normserve export encoder --help`, `normserve export layernorm --help`.",
    )
    parser.add_argument(
        "--repository",
        "--out-dir",
        type=Path,
        default=Path("models"),
        help="model repository (default: models; --out-dir is its old name)",
    )
    parser.add_argument("--checkpoint", type=Path, help="state_dict for the post-LN encoder (default: seeded)")
    parser.add_argument("--checkpoint-preln", type=Path, help="state_dict for the pre-LN encoder (default: seeded)")
    for field in CONFIG_FLAGS:
        default = getattr(EncoderConfig(), field)
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, default=default, help=f"default {default}")
    parser.add_argument("--seed", type=int, default=0, help="seed of the default weights (default 0)")
    _add_common(parser)
    return parser


def _encoder_parser() -> argparse.ArgumentParser:
    parser = _kind_parser(
        "encoder",
        "a state_dict of torch.nn.TransformerEncoder (batch_first, ReLU, norm=nn.LayerNorm for pre-LN) "
        "or of normserve's Encoder",
    )
    parser.add_argument(
        "--num-heads", type=int, required=True, help="attention heads (required: a state_dict does not record them)"
    )
    for field in ("d_model", "d_ff", "num_layers"):
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, help="default: read from the checkpoint")
    default = EncoderConfig().max_sequence_length
    parser.add_argument("--max-sequence-length", type=int, default=default, help=f"default {default}")
    placement = parser.add_mutually_exclusive_group()
    placement.add_argument("--pre-ln", dest="norm_first", action="store_const", const=True, help="pre-LN")
    placement.add_argument("--post-ln", dest="norm_first", action="store_const", const=False, help="post-LN")
    parser.set_defaults(norm_first=None)  # read from the checkpoint: pre-LN has a final norm (norm.weight)
    parser.add_argument("--eps", type=float, default=DEFAULT_EPS, help=f"LayerNorm eps (default {DEFAULT_EPS:g})")
    return parser


def _layernorm_parser() -> argparse.ArgumentParser:
    parser = _kind_parser(
        "layernorm", "a state_dict of torch.nn.LayerNorm: weight and bias of the normalized_shape (bias optional)"
    )
    parser.add_argument(
        "--eps",
        type=float,
        default=DEFAULT_EPS,
        help=f"its eps, used when a request passes none (default {DEFAULT_EPS:g})",
    )
    return parser


def _kind_parser(kind: str, checkpoint: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"normserve export {kind}",
        description=f"Export a trained {kind} as the next version of --name in the repository (1 for a new name); "
        "nothing is written if it fails onnx.checker or parity against PyTorch and NumPy.",
    )
    parser.add_argument("--name", type=model_name, required=True, help=f"model name, matching {NAME.pattern}")
    parser.add_argument("--checkpoint", type=Path, required=True, help=checkpoint)
    parser.add_argument("--repository", type=Path, default=Path("models"), help="model repository (default: models)")
    _add_common(parser)
    return parser


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--opset", type=int, default=18, help="ONNX opset (default 18)")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="max abs parity difference (default 1e-4)")


def model_name(value: str) -> str:
    """--name as the repository allows it, checked before any path is built from it."""
    if not NAME.fullmatch(value):
        raise argparse.ArgumentTypeError(f"expected a model name matching {NAME.pattern}, got {value!r}")
    return value


def config(args: argparse.Namespace) -> EncoderConfig:
    """The default encoders' size from the parsed flags."""
    return EncoderConfig(**{field: getattr(args, field) for field in CONFIG_FLAGS})


def encoder_sizes(args: argparse.Namespace) -> dict[str, int | float | bool | None]:
    """`normserve export encoder`'s size flags; None where the checkpoint is to say."""
    fields = (*CONFIG_FLAGS, "norm_first", "eps")
    return {field: getattr(args, field) for field in fields}
