"""app/export/checks.py: the user's own input/output pair pins an export to their module; a wrong flag writes nothing."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from app.core.repository import Repository
from app.export.exporter import main
from tests.export.test_sources import perturbed


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GELU post-LN stack of 4 heads saved as a state_dict, with its input, mask and output as .npy files."""
    base = tmp_path_factory.mktemp("pair")
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu", batch_first=True)
    module = perturbed(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), seed=3)
    torch.save(module.state_dict(), base / "model.pt")
    x = np.random.default_rng(4).standard_normal((2, 6, 16)).astype(np.float32)
    mask = np.zeros((2, 6), dtype=bool)
    mask[1, 4:] = True
    with torch.no_grad():
        y = module(torch.from_numpy(x), src_key_padding_mask=torch.from_numpy(mask)).numpy()
    for name, array in (("x", x), ("y", y), ("mask", mask)):
        np.save(base / f"{name}.npy", array)
    return base


def _argv(base: Path, repo: Path, *flags: str) -> list[str]:
    checks = ["--check-input", str(base / "x.npy"), "--check-output", str(base / "y.npy")]
    model = ["--checkpoint", str(base / "model.pt"), "--repository", str(repo), "--max-sequence-length", "16"]
    return ["encoder", "--name", "mine", *model, *checks, "--check-mask", str(base / "mask.npy"), *flags]


@pytest.mark.parametrize(
    "flags",
    [
        ["--num-heads", "2", "--activation", "gelu"],
        ["--num-heads", "4"],
        ["--num-heads", "4", "--activation", "gelu_tanh"],
    ],
    ids=["wrong-heads", "wrong-activation-relu", "wrong-activation-gelu-tanh"],
)
def test_a_wrong_flag_is_refused_by_the_check_pair_and_writes_nothing(
    pair: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    repo = tmp_path / "models"
    assert main(_argv(pair, repo, *flags), progress=lambda _m: None) == 1
    # The figure is onnxruntime's: its digits are matched as a number, not compared.
    message = re.fullmatch(
        "normserve export: error: check failed: the exported model's output differs from "
        + re.escape(str(pair / "y.npy"))
        + r" by (\d\.\d{3}e[-+]\d\d) at index \[([01]), ([0-5]), (\d+)\] \(tolerance 1e-04\); nothing written\n",
        capsys.readouterr().err,
    )
    assert message is not None and float(message.group(1)) > 1e-4
    assert not (message.group(2) == "1" and int(message.group(3)) >= 4), "never at a padded position"
    assert not repo.exists()


def test_the_right_flags_pass_the_check_pair_and_the_manifest_records_it(pair: Path, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    assert main(_argv(pair, repo, "--num-heads", "4", "--activation", "gelu"), progress=lambda _m: None) == 0
    check = Repository(repo).manifest("mine", 1)["check"]
    assert check["max_abs_diff"] <= 1e-4 and check["tolerance"] == 1e-4 and check["shape"] == [2, 6, 16]
    assert set(check["sha256"]) == {"input", "output", "mask"}


def test_a_layernorm_module_is_pinned_by_its_pair_and_a_wrong_output_names_its_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = perturbed(nn.LayerNorm((2, 4), eps=1e-3), seed=5)
    torch.save(module, tmp_path / "ln.pt")
    x = (3 * np.random.default_rng(6).standard_normal((3, 2, 4))).astype(np.float32)
    with torch.no_grad():
        y = module(torch.from_numpy(x)).numpy()
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    y[1, 0, 3] += 0.01  # one value that the module did not answer
    np.save(tmp_path / "wrong.npy", y)
    repo = tmp_path / "models"
    argv = ["layernorm", "--name", "ln", "--module", str(tmp_path / "ln.pt"), "--repository", str(repo)]
    argv += ["--check-input", str(tmp_path / "x.npy"), "--check-output"]
    assert main([*argv, str(tmp_path / "y.npy")], progress=lambda _m: None) == 0
    assert Repository(repo).manifest("ln", 1)["check"]["max_abs_diff"] <= 1e-5
    capsys.readouterr()
    assert main([*argv, str(tmp_path / "wrong.npy")], progress=lambda _m: None) == 1
    message = re.fullmatch(
        "normserve export: error: check failed: the exported model's output differs from "
        + re.escape(str(tmp_path / "wrong.npy"))
        + r" by (\d\.\d{3}e-02) at index \[1, 0, 3\] \(tolerance 1e-04\); nothing written\n",
        capsys.readouterr().err,
    )
    assert message is not None and abs(float(message.group(1)) - 0.01) < 1e-4
    assert Repository(repo).versions("ln") == [1]
