"""`normserve export`'s options, with no torch: `--help` and bad flags answer on an install without the export extra.

Three commands share the name: `normserve export` (the three default models, version 1 each),
`normserve export encoder` and `normserve export layernorm` (a user's checkpoint, as the next version of
its name). The first word picks the parser, rather than argparse subparsers: the defaults' flags
(--checkpoint, --d-model ...) have other meanings in the kinds' commands, and a subparser's defaults
would overwrite them.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from app.core.reference import ACTIVATIONS, POSITIONAL_ENCODINGS, EncoderConfig
from app.core.repository import NAME, check_version

CONFIG_FLAGS = ("d_model", "num_heads", "d_ff", "num_layers", "max_sequence_length")  # --d-model ...
KINDS = ("encoder", "layernorm")
TEXT_ENCODER = "text-encoder"  # a Hugging Face folder: flags of its own, none shared with the kinds above
POOLINGS = ("mean", "cls", "none")  # app.core.textreference.POOLINGS, which imports NumPy only
DEFAULT_TEXT_TOLERANCE = 2e-5  # max abs of the embeddings against the user's model (API.md section 12)
DEFAULT_EPS = 1e-5  # torch.nn.LayerNorm's: a checkpoint does not hold eps (the module does)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The flags of whichever command argv[0] names; `kind` is None for the defaults, else encoder or layernorm."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == TEXT_ENCODER:
        return _text_encoder_parser().parse_args(argv[1:], argparse.Namespace(kind=TEXT_ENCODER))
    if argv and argv[0] in KINDS:
        parser = _encoder_parser() if argv[0] == "encoder" else _layernorm_parser()
        args = parser.parse_args(argv[1:], argparse.Namespace(kind=argv[0]))
        try:
            check_source_flags(args)
        except ValueError as e:
            parser.error(str(e))  # exit 2, as argparse's own refusals
        return args
    return _defaults_parser().parse_args(argv, argparse.Namespace(kind=None))


def _defaults_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="normserve export",
        description="Export the default models (layernorm, encoder, encoder-preln) as version 1 of each, replacing "
        "it; nothing is written if a model fails onnx.checker or parity against PyTorch and NumPy. "
        "A repository in the old layout (a top-level manifest.json) is migrated first.",
        epilog="A trained model of your own: `normserve export encoder --help`, `normserve export layernorm --help`; "
        "a Hugging Face text encoder: `normserve export text-encoder --help`.",
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
        "torch.nn.TransformerEncoder, a lone torch.nn.TransformerEncoderLayer or normserve's Encoder",
        "a state_dict of torch.nn.TransformerEncoder (or of a lone layer, or of normserve's Encoder); "
        "what it does not record is given by the flags below",
    )
    state = parser.add_argument_group("what a state_dict does not record (--checkpoint only)")
    state.add_argument("--num-heads", type=int, help="attention heads (required with --checkpoint)")
    state.add_argument(
        "--activation", choices=ACTIVATIONS, help="of the feed-forward: relu (default), gelu (erf form), gelu_tanh"
    )
    placement = state.add_mutually_exclusive_group()
    placement.add_argument("--pre-ln", dest="norm_first", action="store_const", const=True, help="norm_first=True")
    placement.add_argument("--post-ln", dest="norm_first", action="store_const", const=False, help="norm_first=False")
    parser.set_defaults(norm_first=None)  # read from the checkpoint: pre-LN when it has a final norm (norm.weight)
    state.add_argument("--eps", type=float, help=f"every LayerNorm's eps (default {DEFAULT_EPS:g})")
    for field in ("d_model", "d_ff", "num_layers"):
        state.add_argument(f"--{field.replace('_', '-')}", type=int, help="default: read from the checkpoint")
    default = EncoderConfig().max_sequence_length
    parser.add_argument("--max-sequence-length", type=int, default=default, help=f"default {default}")
    parser.add_argument(
        "--positional-encoding",
        choices=POSITIONAL_ENCODINGS,
        help="the seeds' sinusoidal encoding added before the first layer, or none; default: none for PyTorch's "
        "modules and their state_dicts (they have none), sinusoidal for normserve's own encoder",
    )
    _add_check(parser, "(B,T,C) float32 input, batch first as the server takes it", "(B,T) bool, true at padding")
    return parser


def _layernorm_parser() -> argparse.ArgumentParser:
    parser = _kind_parser(
        "layernorm",
        "torch.nn.LayerNorm (any normalized_shape, bias=False, elementwise_affine=False)",
        "a state_dict of torch.nn.LayerNorm: weight and bias of the normalized_shape (bias optional)",
    )
    parser.add_argument(
        "--eps",
        type=float,
        help=f"with --checkpoint: its eps, used when a request passes none (default {DEFAULT_EPS:g})",
    )
    _add_check(parser, "float32 input ending in the normalized_shape", None)
    return parser


def _text_encoder_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"normserve export {TEXT_ENCODER}",
        description="Export a Hugging Face BERT-family text encoder (bert, roberta, xlm-roberta, distilbert) from a "
        "local folder as the next version of --name (1 for a new name). Nothing is fetched from a hub. Nothing is "
        "written if the folder holds another architecture, code of its own (trust_remote_code), no tokenizer.json "
        "or an adapter, or if the graph's embeddings differ from PyTorch's, sentence-transformers' or the NumPy "
        "reference's beyond the bounds.",
    )
    parser.add_argument("--name", type=model_name, required=True, help=f"model name, matching {NAME.pattern}")
    parser.add_argument(
        "--hf",
        type=Path,
        required=True,
        metavar="PATH",
        help="a folder as save_pretrained or sentence-transformers write it: config.json, model.safetensors (or "
        "pytorch_model.bin, loaded weights-only), tokenizer.json; modules.json, 1_Pooling/config.json and "
        "sentence_bert_config.json where present",
    )
    _add_text_head(parser)
    parser.add_argument(
        "--tolerance",
        type=positive_float,
        default=DEFAULT_TEXT_TOLERANCE,
        help=f"max abs of the embeddings against your model (default {DEFAULT_TEXT_TOLERANCE:g}); cosine at "
        "least 0.99999 always",
    )
    _add_texts(parser)
    _add_graph_choices(parser)
    parser.add_argument("--version", type=version_number, help="write this version, replacing it (default: the next)")
    parser.add_argument(
        "--repository", "--model-dir", type=Path, default=Path("models"), help="model repository (default: models)"
    )
    parser.add_argument("--opset", type=int, default=18, help="ONNX opset (default 18)")
    return parser


def _add_graph_choices(parser: argparse.ArgumentParser) -> None:
    """What graph is written: INT8 (--quantize) or fused (--optimize), each only past its checks."""
    parser.add_argument(
        "--quantize",
        choices=("int8",),
        help="onnxruntime's dynamic INT8 quantization of the checked graph, refused unless every check text keeps "
        "cosine 0.99 with the FP32 model",
    )
    parser.add_argument(
        "--optimize",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="write the graph fused by onnxruntime's transformer optimizer (Attention, SkipLayerNormalization, ...) "
        "when it keeps every parity, else the plain one (default: off; not with --quantize, which quantizes the "
        "plain graph)",
    )


def _add_text_head(parser: argparse.ArgumentParser) -> None:
    """The flags of what follows the transformer (length, pooling, normalization): each None unless given, so
    that the folder's sentence-transformers files decide, as the model was trained."""
    head = parser.add_argument_group("the head: read from the folder unless given")
    head.add_argument(
        "--max-sequence-length",
        type=int,
        help="tokens a text is truncated to (default: sentence_bert_config.json's "
        "max_seq_length, else config.json's max_position_embeddings less RoBERTa's offset)",
    )
    head.add_argument("--pooling", choices=POOLINGS, help="default: 1_Pooling/config.json's mode; mean without it")
    norm = head.add_mutually_exclusive_group()
    norm.add_argument("--normalize", dest="normalize", action="store_const", const=True, help="L2-normalize")
    norm.add_argument("--no-normalize", dest="normalize", action="store_const", const=False, help="do not")
    parser.set_defaults(normalize=None)  # a Normalize module in modules.json, else none


def _add_texts(parser: argparse.ArgumentParser) -> None:
    """The text files of a text encoder's export: UTF-8, one text a line, blank lines skipped."""
    parser.add_argument("--check-texts", type=Path, metavar="FILE", help="texts of yours, one a line, for parity")
    parser.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="texts like the traffic to come, UTF-8, one a line: the drift monitor's baseline (each LayerNorm's "
        "per-token input mean and std) is measured on them (default: the parity texts, of several languages)",
    )


def _kind_parser(kind: str, module: str, checkpoint: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"normserve export {kind}",
        description=f"Export a trained {kind} as the next version of --name in the repository (1 for a new name); "
        "nothing is written if it fails onnx.checker or parity against the module (or the state_dict's rebuilt "
        "twin) and NumPy, or the --check pair.",
    )
    parser.add_argument("--name", type=model_name, required=True, help=f"model name, matching {NAME.pattern}")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--module",
        type=Path,
        help=f"a whole module saved with torch.save(module): {module}; every setting is read from it and parity "
        "is measured against it. Loading a pickled module runs code from the file: only load files you trust",
    )
    source.add_argument("--checkpoint", type=Path, help=checkpoint)
    parser.add_argument("--repository", type=Path, default=Path("models"), help="model repository (default: models)")
    parser.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE.npy",
        help="inputs like the traffic to come, batch first as the server takes them: the drift monitor's baseline "
        "(each LayerNorm's per-position input mean and std) is measured on them (default: the parity inputs)",
    )
    _add_common(parser)
    return parser


def _add_check(parser: argparse.ArgumentParser, check_input: str, check_mask: str | None) -> None:
    check = parser.add_argument_group(
        "your own input and your module's output: the export fails, writing nothing, when its answer differs "
        "by more than --tolerance"
    )
    check.add_argument("--check-input", type=Path, metavar="X.npy", help=check_input)
    check.add_argument("--check-output", type=Path, metavar="Y.npy", help="your module's output for X.npy")
    if check_mask is not None:
        check.add_argument("--check-mask", type=Path, metavar="M.npy", help=check_mask)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--opset", type=int, default=18, help="ONNX opset (default 18)")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="max abs parity difference (default 1e-4)")


def model_name(value: str) -> str:
    """--name as the repository allows it, checked before any path is built from it."""
    if not NAME.fullmatch(value):
        raise argparse.ArgumentTypeError(f"expected a model name matching {NAME.pattern}, got {value!r}")
    return value


def version_number(value: str) -> int:
    """--version as the repository names versions: 1, 2, ..."""
    try:
        return check_version(value, "")  # no field: argparse names the flag
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_float(value: str) -> float:
    """--tolerance: a bound of zero, a negative one or NaN would fail every export, or none."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    return number


def config(args: argparse.Namespace) -> EncoderConfig:
    """The default encoders' size from the parsed flags."""
    return EncoderConfig(**{field: getattr(args, field) for field in CONFIG_FLAGS})


STATE_FLAGS = ("num_heads", "d_model", "d_ff", "num_layers", "norm_first", "eps", "activation")


def encoder_sizes(args: argparse.Namespace) -> dict[str, int | float | bool | str | None]:
    """`normserve export encoder`'s architecture flags; None where the checkpoint or module is to say."""
    fields = (*STATE_FLAGS, "max_sequence_length", "positional_encoding")
    return {field: getattr(args, field) for field in fields}


def check_source_flags(args: argparse.Namespace) -> None:
    """ValueError for flags that contradict the source: a module says every setting, a state_dict not the heads."""
    given = [f"--{f.replace('_', '-')}" for f in STATE_FLAGS if getattr(args, f, None) is not None]
    if args.kind == "encoder" and args.module is not None and given:
        raise ValueError(f"{', '.join(given)}: with --module every setting is read from the module; leave it out")
    if args.kind == "encoder" and args.checkpoint is not None and args.num_heads is None:
        raise ValueError("--num-heads is required with --checkpoint: a state_dict does not record it")
    if args.kind == "layernorm" and args.module is not None and args.eps is not None:
        raise ValueError("--eps: with --module the eps is read from the module; leave it out")
    if (args.check_input is None) != (args.check_output is None) or (
        getattr(args, "check_mask", None) is not None and args.check_input is None
    ):
        raise ValueError("--check-input and --check-output go together (and --check-mask with them)")
