"""`normserve export`'s options, with no torch: `--help` and bad flags answer on an install without the export extra."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from app.core.reference import EncoderConfig

CONFIG_FLAGS = ("d_model", "num_heads", "d_ff", "num_layers", "max_sequence_length")  # --d-model ...


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="normserve export",
        description="Export the LayerNorm and encoder models to ONNX with a manifest; "
        "refuses to write anything if a model fails onnx.checker or parity against PyTorch and NumPy.",
    )
    parser.add_argument("--out-dir", type=Path, default=Path("models"), help="output directory (default: models)")
    parser.add_argument("--checkpoint", type=Path, help="state_dict for the post-LN encoder (default: seeded)")
    parser.add_argument("--checkpoint-preln", type=Path, help="state_dict for the pre-LN encoder (default: seeded)")
    for field in CONFIG_FLAGS:
        default = getattr(EncoderConfig(), field)
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, default=default, help=f"default {default}")
    parser.add_argument("--seed", type=int, default=0, help="seed of the default weights (default 0)")
    parser.add_argument("--opset", type=int, default=18, help="ONNX opset (default 18)")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="max abs parity difference (default 1e-4)")
    return parser.parse_args(argv)


def config(args: argparse.Namespace) -> EncoderConfig:
    """The encoder's size from the parsed flags."""
    return EncoderConfig(**{field: getattr(args, field) for field in CONFIG_FLAGS})
