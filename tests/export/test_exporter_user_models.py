"""app/export/exporter.py on users' trained models: `normserve export encoder|layernorm --name NAME --checkpoint PATH`.

Two torch.nn.TransformerEncoder stacks of different sizes (post-LN; pre-LN with a final norm) and a
torch.nn.LayerNorm over (2, 8), each trained a few steps, exported into one repository; the post-LN one
twice. The exported graphs are then run with onnxruntime directly and compared with torch's modules and
with the NumPy reference on the exported weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

import app
from app.core.monitor import LEVELS, Baseline
from app.core.reference import EncoderConfig, encoder, layer_norm, layer_norm_names
from app.core.repository import Repository
from app.export.exporter import Exported, ParityError, export_encoder, export_layernorm, main
from tests.export.test_versions import _old_layout
from tests.export.trained import USER_ENCODERS, UserEncoder, save, torch_encode
from tests.export.trained import layer_norm as trained_layer_norm
from tests.live_server import ROOT

LN_SHAPE = (2, 8)
LN_EPS = 1e-3  # not torch's default: the manifest and the server must carry it
ATOL = 1e-4


@dataclasses.dataclass
class Users:
    root: Path
    encoders: dict[str, tuple[UserEncoder, torch.nn.TransformerEncoder, Exported]]
    layernorm: tuple[torch.nn.LayerNorm, Exported]
    again: Exported  # USER_ENCODERS[0] exported a second time
    messages: list[str]


def _sizes(cfg: EncoderConfig) -> dict[str, Any]:
    """What the command's flags give: the rest is read from the checkpoint."""
    return {"num_heads": cfg.num_heads, "max_sequence_length": cfg.max_sequence_length, "eps": cfg.eps}


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> Users:
    base = tmp_path_factory.mktemp("users")
    root, messages = base / "models", []
    encoders = {}
    for spec in USER_ENCODERS:
        model = spec.build()
        path = save(model, base / f"{spec.id}.pt")
        done = export_encoder(root, spec.id, path, sizes=_sizes(spec.cfg), progress=messages.append)
        encoders[spec.id] = (spec, model, done)
    first = USER_ENCODERS[0]
    again = export_encoder(root, first.id, base / f"{first.id}.pt", sizes=_sizes(first.cfg))
    module = trained_layer_norm(LN_SHAPE, eps=LN_EPS)
    done = export_layernorm(root, "my-layernorm", save(module, base / "ln.pt"), eps=LN_EPS, progress=messages.append)
    return Users(root, encoders, (module, done), again, messages)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _session(folder: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}


def test_each_export_is_the_next_version_of_its_name(users: Users) -> None:
    repo = Repository(users.root)
    assert repo.names() == sorted([*users.encoders, "my-layernorm"])
    assert [(name, repo.versions(name)) for name in repo.names()] == [
        ("my-layernorm", [1]),
        ("post-ln-32x4x1", [1, 2]),
        ("pre-ln-48x6x3", [1]),
    ]
    assert (users.again.version, users.again.folder) == (2, users.root / "post-ln-32x4x1" / "2")
    first = users.encoders["post-ln-32x4x1"][2]
    assert users.again.manifest == {**first.manifest, "version": 2}, "the same checkpoint: the same files"
    assert not [p for p in users.root.iterdir() if p.name.startswith(".")], "no staging folder left"


@pytest.mark.parametrize("spec", USER_ENCODERS, ids=lambda u: u.id)
def test_encoder_manifest(users: Users, spec: UserEncoder) -> None:
    done = users.encoders[spec.id][2]
    m = done.manifest
    assert json.loads((done.folder / "manifest.json").read_text()) == m
    assert (m["format_version"], m["name"], m["version"], m["kind"]) == (2, spec.id, 1, "encoder")
    assert m["config"] == dataclasses.asdict(spec.cfg)
    assert m["files"] == {f: _sha256(done.folder / f) for f in ("model.onnx", "weights.npz")}
    assert m["layer_norms"] == layer_norm_names(spec.cfg)
    d = spec.cfg.d_model
    assert m["inputs"] == [
        {"datatype": "FP32", "name": "input", "shape": [-1, -1, d]},
        {"datatype": "BOOL", "name": "padding_mask", "shape": [-1, -1]},
    ]
    assert [o["name"] for o in m["outputs"]][:3] == ["output", "layers.0.norm1.mean", "layers.0.norm1.std"]
    assert (m["opset"], m["normserve"], m["versions"]["torch"]) == (18, app.__version__, torch.__version__)
    assert m["parity"]["onnx_vs_torch"] <= ATOL and m["parity"]["onnx_vs_numpy"] <= ATOL
    assert m["parity"]["tolerance"] == ATOL and f"[2,{spec.cfg.max_sequence_length},{d}]" in m["parity"]["inputs"]


def test_learned_layernorm_manifest(users: Users) -> None:
    done = users.layernorm[1]
    m = done.manifest
    assert (m["format_version"], m["name"], m["version"], m["kind"]) == (2, "my-layernorm", 1, "layernorm")
    assert m["config"] == {"normalized_shape": list(LN_SHAPE), "eps": LN_EPS, "elementwise_affine": True, "bias": True}
    assert m["files"] == {f: _sha256(done.folder / f) for f in ("model.onnx", "weights.npz")}
    committed = json.loads((ROOT / "models" / "layernorm" / "1" / "manifest.json").read_text())
    assert m["files"]["model.onnx"] == committed["files"]["model.onnx"], "the default's generic graph"
    assert (m["inputs"], m["outputs"]) == (committed["inputs"], committed["outputs"])
    assert m["parity"]["onnx_vs_torch"] <= ATOL and m["parity"]["onnx_vs_numpy"] <= ATOL
    assert m["parity"]["inputs"].startswith(
        "the LayerNorm's gamma and beta (1 and 0 where it has none) and eps 0.001 (eps_mode var)"
    )


@pytest.mark.parametrize("spec", USER_ENCODERS, ids=lambda u: u.id)
def test_exported_encoder_computes_what_torch_and_the_reference_do(users: Users, spec: UserEncoder) -> None:
    _, model, done = users.encoders[spec.id]
    weights = _npz(done.folder / "weights.npz")
    x = np.random.default_rng(7).standard_normal((3, 11, spec.cfg.d_model)).astype(np.float32)
    mask = np.zeros((3, 11), dtype=bool)
    mask[1, 6:] = True
    mask[2, 1:] = True
    got = _session(done.folder).run(None, {"input": x, "padding_mask": mask})
    ref, stats = encoder(x, weights, EncoderConfig(**done.manifest["config"]), mask)
    np.testing.assert_allclose(got[0], torch_encode(model, x, mask), atol=ATOL, rtol=0)
    np.testing.assert_allclose(got[0], ref, atol=ATOL, rtol=0)
    for (_, mean, std), got_mean, got_std in zip(stats, got[1::2], got[2::2], strict=True):
        np.testing.assert_allclose(got_mean, mean, atol=ATOL, rtol=0)
        np.testing.assert_allclose(got_std, std, atol=ATOL, rtol=0)
    assert np.abs(got[0] - torch_encode(spec.build(seed=1), x, mask)).max() > 0.1, "these weights, not others"


@pytest.mark.parametrize("batch", [(1,), (4,), (2, 3)], ids=str)
def test_exported_layernorm_fed_its_weights_computes_what_torch_and_the_reference_do(
    users: Users, batch: tuple[int, ...]
) -> None:
    module, done = users.layernorm
    weights, eps = _npz(done.folder / "weights.npz"), done.manifest["config"]["eps"]
    assert {k: (v.dtype, v.shape) for k, v in weights.items()} == {
        "gamma": (np.float32, LN_SHAPE),
        "beta": (np.float32, LN_SHAPE),
    }
    x = (3 * np.random.default_rng(3).standard_normal((*batch, *LN_SHAPE))).astype(np.float32)
    rows, cols = int(np.prod(batch)), int(np.prod(LN_SHAPE))
    eps_var = np.full((rows, 1), eps, np.float32)
    feeds = {
        "input": x.reshape(rows, cols),
        "gamma": weights["gamma"].reshape(cols),
        "beta": weights["beta"].reshape(cols),
    }
    out, mean, _ = _session(done.folder).run(None, {**feeds, "eps_var": eps_var, "eps_std": np.zeros_like(eps_var)})
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    ref = layer_norm(x, len(LN_SHAPE), eps, "var", weights["gamma"], weights["beta"])
    np.testing.assert_allclose(out.reshape(x.shape), expected, atol=ATOL, rtol=0)
    np.testing.assert_allclose(out.reshape(x.shape), ref.output, atol=ATOL, rtol=0)
    np.testing.assert_allclose(mean.reshape(batch), ref.mean, atol=ATOL, rtol=0)


# What a state_dict export prints beside the architecture (the file's keys cannot tell the heads or the activation).
NOTE = (
    "a state_dict does not record the heads, the activation or the norm placement: {heads} heads, relu and "
    "{placement} are taken from the flags (--num-heads, --activation, --pre-ln/--post-ln); to check them against "
    "your module, pass --check-input X.npy --check-output Y.npy, an input and the output your module gave for it"
)


def test_progress_names_each_model_its_architecture_and_its_parity(users: Users) -> None:
    assert [m for m in users.messages if not m.startswith("parity")] == [
        "architecture of post-ln-32x4x1: state_dict: 1 layers, d_model 32, 4 heads, d_ff 64, relu, post-LN, "
        "eps 1e-05, no final norm, bias, positional encoding none",
        f"note: {NOTE.format(heads=4, placement='post-LN')}",
        "exporting post-ln-32x4x1 (post-LN, d_model 32, opset 18) ...",
        "architecture of pre-ln-48x6x3: state_dict: 3 layers, d_model 48, 6 heads, d_ff 96, relu, pre-LN, "
        "eps 1e-05, final norm (eps 1e-05), bias, positional encoding none",
        f"note: {NOTE.format(heads=6, placement='pre-LN')}",
        "exporting pre-ln-48x6x3 (pre-LN, d_model 48, opset 18) ...",
        "exporting my-layernorm (layernorm, normalized_shape [2, 8], opset 18) ...",
    ]
    parities = [m.split(":")[0] for m in users.messages if m.startswith("parity")]
    assert parities == [f"parity {n}" for n in (*users.encoders, "my-layernorm")]


def test_the_command_prints_the_name_version_and_folder(
    users: Users, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save(users.layernorm[0], tmp_path / "ln.pt")
    repo = tmp_path / "models"
    for version in (1, 2):
        assert main(["layernorm", "--name", "ln", "--checkpoint", str(path), "--repository", str(repo)]) == 0
        assert capsys.readouterr().out == f"exported ln version {version} to {repo}/ln/{version}\n"
    config = {"normalized_shape": [2, 8], "eps": 1e-5, "elementwise_affine": True, "bias": True}
    assert Repository(repo).manifest("ln", 2)["config"] == config


@pytest.mark.parametrize("kind", ["encoder", "layernorm"])
def test_a_failed_parity_check_writes_nothing(users: Users, tmp_path: Path, kind: str) -> None:
    before = sorted(users.root.rglob("*"))
    spec = USER_ENCODERS[0]
    with pytest.raises(ParityError, match=rf"^parity failed for {kind}-x: onnx vs torch .*; nothing written$"):
        if kind == "encoder":
            path = save(spec.build(), tmp_path / "e.pt")
            export_encoder(users.root, "encoder-x", path, sizes=_sizes(spec.cfg), tolerance=1e-12)
        else:
            export_layernorm(users.root, "layernorm-x", save(users.layernorm[0], tmp_path / "l.pt"), tolerance=1e-12)
    assert sorted(users.root.rglob("*")) == before


def test_a_refused_checkpoint_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = USER_ENCODERS[0].build().state_dict()
    del state["layers.0.self_attn.in_proj_bias"]
    path = tmp_path / "bad.pt"
    torch.save(state, path)
    repo = tmp_path / "models"
    argv = ["encoder", "--name", "bad", "--checkpoint", str(path), "--num-heads", "4", "--repository", str(repo)]
    assert main(argv) == 1
    assert capsys.readouterr() == (
        "",
        f"normserve export: error: {path} does not fit the torch.nn.TransformerEncoder that its keys and the flags "
        "describe (d_model 32, d_ff 64, 1 layers, no final norm, bias=True) (missing keys "
        "layers.0.self_attn.in_proj_bias); check --d-model, --d-ff, --num-layers and the norm placement\n",
    )
    assert not repo.exists()


@pytest.mark.parametrize(
    ("kind", "flags", "saved"),
    [
        ("encoder", ["--num-heads", "4"], "torch.nn.TransformerEncoder"),
        ("layernorm", [], "torch.nn.LayerNorm"),
    ],
)
def test_a_whole_module_given_as_a_checkpoint_says_to_use_module(
    users: Users, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, flags: list[str], saved: str
) -> None:
    module = USER_ENCODERS[0].build() if kind == "encoder" else users.layernorm[0]
    path = tmp_path / "whole.pt"
    torch.save(module, path)  # the module itself, as the README's walkthrough saves it: not its state_dict
    repo = tmp_path / "models"
    assert main([kind, "--name", "mine", "--checkpoint", str(path), *flags, "--repository", str(repo)]) == 1
    assert capsys.readouterr() == (
        "",
        f"normserve export: error: {path}: this is a whole module ({saved}), not a state_dict: use --module "
        f"(`normserve export {kind} --module`)\n",
    )
    assert not repo.exists()


def test_an_old_layout_is_migrated_before_the_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "models"
    _old_layout(repo)
    path = save(trained_layer_norm((4,)), tmp_path / "ln.pt")
    said: list[str] = []
    assert main(["layernorm", "--name", "ln", "--checkpoint", str(path), "--repository", str(repo)], said.append) == 0
    assert said[0] == f"migrated {repo} from the old layout (manifest.json) into versions: encoder/1, layernorm/1"
    assert capsys.readouterr().out == f"exported ln version 1 to {repo}/ln/1\n"
    assert Repository(repo).names() == ["encoder", "layernorm", "ln"]
    assert not (repo / "manifest.json").exists()


def test_a_calibration_file_is_the_layernorms_baseline(users: Users, tmp_path: Path) -> None:
    path, calibration = save(users.layernorm[0], tmp_path / "ln.pt"), tmp_path / "traffic.npy"
    np.save(calibration, (3.0 * np.random.default_rng(0).standard_normal((40, *LN_SHAPE))).astype(np.float32))
    repo = tmp_path / "models"
    argv = ["layernorm", "--name", "ln", "--checkpoint", str(path), "--repository", str(repo)]
    assert main([*argv, "--calibration", str(calibration)]) == 0
    baseline = Repository(repo).manifest("ln", 1)["baseline"]
    assert baseline["inputs"] == "--calibration traffic.npy [40, 2, 8], by row"
    std = Baseline.from_json(baseline["layers"]["layernorm"]).std
    assert std.count == 40 and 2.0 < std.quantiles[LEVELS.index(0.5)] < 4.0  # rows of N(0, 3^2)


def test_a_layernorm_exported_without_calibration_has_the_scale_1_parity_baseline(users: Users) -> None:
    baseline = users.layernorm[1].manifest["baseline"]
    assert baseline["inputs"] == "the seeded N(0,1) parity input [5,...] at scale 1, by row"
    std = Baseline.from_json(baseline["layers"]["layernorm"]).std
    assert std.count == 5 and 0.5 < std.quantiles[LEVELS.index(0.5)] < 1.5


@pytest.mark.parametrize(
    ("kind", "shape", "expected"),
    [
        ("layernorm", (4, 8), "(..., 2, 8), got shape [4, 8]"),
        ("encoder", (2, 3, 5), "(batch, seq <= 16, 32), got shape [2, 3, 5]"),
        ("encoder", (1, 17, 32), "(batch, seq <= 16, 32), got shape [1, 17, 32]"),
    ],
)
def test_a_calibration_file_of_the_wrong_shape_is_one_line_and_writes_nothing(
    users: Users, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, shape: tuple[int, ...], expected: str
) -> None:
    calibration, repo = tmp_path / "c.npy", tmp_path / "models"
    np.save(calibration, np.zeros(shape, np.float32))
    if kind == "layernorm":
        source = ["--checkpoint", str(save(users.layernorm[0], tmp_path / "ln.pt"))]
    else:
        spec = USER_ENCODERS[0]
        source = ["--checkpoint", str(save(spec.build(), tmp_path / "e.pt")), "--num-heads", str(spec.cfg.num_heads)]
        source += ["--max-sequence-length", "16"]
    argv = [kind, "--name", "x", *source, "--repository", str(repo), "--calibration", str(calibration)]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        f"normserve export: error: --calibration {calibration}: expected a float array {expected}\n",
    )
    assert not (repo / "x").exists()
