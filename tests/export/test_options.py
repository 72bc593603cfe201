"""app/export/options.py: `normserve export`'s flags, read with no torch imported (the serve install has none)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.core.reference import EncoderConfig
from app.export.options import config, encoder_sizes, parse_args
from tests.live_server import ROOT


def test_defaults_are_the_seeded_models_into_models() -> None:
    args = parse_args([])
    assert args.kind is None and args.repository == Path("models")
    assert args.checkpoint is None and args.checkpoint_preln is None
    assert (args.seed, args.opset, args.tolerance) == (0, 18, 1e-4)
    assert config(args) == EncoderConfig()


def test_size_flags_become_the_encoder_config() -> None:
    args = parse_args(
        ["--d-model", "16", "--num-heads", "2", "--d-ff", "32", "--num-layers", "1", "--max-sequence-length", "8"]
    )
    assert config(args) == EncoderConfig(d_model=16, num_heads=2, d_ff=32, num_layers=1, max_sequence_length=8)


def test_out_dir_is_the_old_name_of_repository() -> None:
    assert parse_args(["--out-dir", "elsewhere"]).repository == Path("elsewhere")


def test_an_encoder_takes_only_the_sizes_given_and_reads_the_rest() -> None:
    args = parse_args(["encoder", "--name", "my-enc", "--checkpoint", "c.pt", "--num-heads", "4", "--d-ff", "64"])
    assert (args.kind, args.name, args.checkpoint, args.repository) == (
        "encoder",
        "my-enc",
        Path("c.pt"),
        Path("models"),
    )
    assert encoder_sizes(args) == {
        "d_model": None,
        "num_heads": 4,
        "d_ff": 64,
        "num_layers": None,
        "max_sequence_length": 512,
        "norm_first": None,
        "eps": None,
        "activation": None,
        "positional_encoding": None,
    }
    assert (args.opset, args.tolerance) == (18, 1e-4)


@pytest.mark.parametrize(("flag", "norm_first"), [("--pre-ln", True), ("--post-ln", False)])
def test_the_norm_placement_can_be_given(flag: str, norm_first: bool) -> None:
    args = parse_args(["encoder", "--name", "e", "--checkpoint", "c.pt", "--num-heads", "2", flag])
    assert args.norm_first is norm_first


def test_a_module_export_takes_the_positional_encoding_and_a_check_pair() -> None:
    argv = ["encoder", "--name", "e", "--module", "m.pt", "--positional-encoding", "sinusoidal"]
    args = parse_args([*argv, "--check-input", "x.npy", "--check-output", "y.npy", "--check-mask", "m.npy"])
    assert (args.module, args.checkpoint, args.positional_encoding) == (Path("m.pt"), None, "sinusoidal")
    assert (args.check_input, args.check_output, args.check_mask) == (Path("x.npy"), Path("y.npy"), Path("m.npy"))


def test_a_checkpoint_export_takes_what_a_state_dict_does_not_record() -> None:
    argv = ["encoder", "--name", "e", "--checkpoint", "c.pt", "--num-heads", "8", "--activation", "gelu_tanh"]
    sizes = encoder_sizes(parse_args([*argv, "--pre-ln", "--eps", "1e-6"]))
    assert {k: sizes[k] for k in ("num_heads", "activation", "norm_first", "eps")} == {
        "num_heads": 8,
        "activation": "gelu_tanh",
        "norm_first": True,
        "eps": 1e-6,
    }


def test_a_layernorm_takes_its_eps() -> None:
    args = parse_args(["layernorm", "--name", "ln.v2", "--checkpoint", "ln.pt", "--eps", "1e-3", "--repository", "r"])
    assert (args.kind, args.name, args.checkpoint, args.eps, args.repository) == (
        "layernorm",
        "ln.v2",
        Path("ln.pt"),
        1e-3,
        Path("r"),
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["encoder", "--name", "e", "--checkpoint", "c.pt"],
            "normserve export encoder: error: --num-heads is required with --checkpoint: a state_dict does not "
            "record it",
        ),
        (
            ["encoder", "--name", "e", "--module", "m.pt", "--num-heads", "2", "--activation", "gelu"],
            "normserve export encoder: error: --num-heads, --activation: with --module every setting is read from "
            "the module; leave it out",
        ),
        (
            ["layernorm", "--name", "e", "--module", "m.pt", "--eps", "1e-3"],
            "normserve export layernorm: error: --eps: with --module the eps is read from the module; leave it out",
        ),
        (
            ["encoder", "--name", "e", "--module", "m.pt", "--check-input", "x.npy"],
            "normserve export encoder: error: --check-input and --check-output go together (and --check-mask with "
            "them)",
        ),
        (
            ["layernorm", "--name", "e"],
            "normserve export layernorm: error: one of the arguments --module --checkpoint is required",
        ),
        (
            ["layernorm", "--name", "e", "--module", "m.pt", "--checkpoint", "c.pt"],
            "normserve export layernorm: error: argument --checkpoint: not allowed with argument --module",
        ),
        (
            ["encoder", "--name", "e", "--checkpoint", "c.pt", "--num-heads", "2", "--activation", "swish"],
            "normserve export encoder: error: argument --activation: invalid choice: 'swish' (choose from "
            "'relu', 'gelu', 'gelu_tanh')",
        ),
        (
            ["layernorm", "--checkpoint", "c.pt"],
            "normserve export layernorm: error: the following arguments are required: --name",
        ),
        (
            ["layernorm", "--name", "../up", "--checkpoint", "c.pt"],
            "normserve export layernorm: error: argument --name: expected a model name matching "
            "[A-Za-z0-9][A-Za-z0-9_.-]{0,63}, got '../up'",
        ),
        (
            ["encoder", "--name", "e", "--checkpoint", "c.pt", "--num-heads", "2", "--pre-ln", "--post-ln"],
            "normserve export encoder: error: argument --post-ln: not allowed with argument --pre-ln",
        ),
        (["--name", "e"], "normserve export: error: unrecognized arguments: --name e"),
    ],
    ids=[
        "encoder-heads",
        "module-with-architecture-flags",
        "module-with-eps",
        "half-a-check-pair",
        "no-source",
        "two-sources",
        "unknown-activation",
        "layernorm-name",
        "bad-name",
        "both-placements",
        "name-without-kind",
    ],
)
def test_a_kind_without_its_required_flags_exits_2_naming_them(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == message


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
        " parse_args(['encoder', '--name', 'e', '--checkpoint', 'c.pt', '--num-heads', '2']);"
        " print(sorted(m for m in ('torch', 'onnx', 'onnxscript') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
