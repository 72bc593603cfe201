"""app/export/options.py: `normserve export`'s flags, read with no torch imported (the serve install has none)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.core.reference import EncoderConfig
from app.export.options import config, parse_args
from tests.live_server import ROOT


def test_defaults_are_the_seeded_models_into_models() -> None:
    args = parse_args([])
    assert args.out_dir == Path("models") and args.checkpoint is None and args.checkpoint_preln is None
    assert (args.seed, args.opset, args.tolerance) == (0, 18, 1e-4)
    assert config(args) == EncoderConfig()


def test_size_flags_become_the_encoder_config() -> None:
    args = parse_args(
        ["--d-model", "16", "--num-heads", "2", "--d-ff", "32", "--num-layers", "1", "--max-sequence-length", "8"]
    )
    assert config(args) == EncoderConfig(d_model=16, num_heads=2, d_ff=32, num_layers=1, max_sequence_length=8)


def test_a_bad_flag_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(["--num-layers", "two"])
    assert e.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == "normserve export: error: argument --num-layers: invalid int value: 'two'"
    )


def test_reading_the_flags_imports_no_torch_or_onnx() -> None:
    code = (
        "import sys; from app.export.options import parse_args; parse_args(['--d-model', '16']);"
        " print(sorted(m for m in ('torch', 'onnx', 'onnxscript') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
