"""The default models exported end to end on a small config: versions, checker, manifests, checkpoints, refusals.

Users' models (`normserve export encoder|layernorm`) are tested in test_exporter_user_models.py.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import app
from app.core.encoder import output_names
from app.core.monitor import Baseline
from app.core.reference import EncoderConfig, layer_norm_names
from app.core.repository import Repository
from app.export.exporter import Exported, ParityError, export_defaults, main
from app.export.modules import CheckpointError, seeded_encoder

ROOT = Path(__file__).resolve().parents[2]
SMALL = EncoderConfig(d_model=16, num_heads=2, d_ff=32, num_layers=1, max_sequence_length=32)
SMALL_FLAGS = [
    "--d-model",
    "16",
    "--num-heads",
    "2",
    "--d-ff",
    "32",
    "--num-layers",
    "1",
    "--max-sequence-length",
    "32",
]
ENCODERS = {"encoder": False, "encoder-preln": True}  # name -> norm_first
NAMES = ["layernorm", *ENCODERS]
FILES = {
    "layernorm/1": ["manifest.json", "model.onnx"],
    "encoder/1": ["manifest.json", "model.onnx", "weights.npz"],
    "encoder-preln/1": ["manifest.json", "model.onnx", "weights.npz"],
}
MANIFEST_KEYS = {
    "format_version", "name", "version", "kind", "config", "inputs", "outputs", "files", "opset", "parity", "baseline",
}  # fmt: skip


@dataclasses.dataclass
class Export:
    out: Path
    exported: list[Exported]
    messages: list[str]
    checkpoint: Path
    checkpoint_model: torch.nn.Module  # the post-LN weights exported from `checkpoint`

    def manifest(self, name: str) -> dict[str, Any]:
        return next(e.manifest for e in self.exported if e.name == name)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Export:
    """One export of the small config: post-LN weights from a checkpoint, pre-LN seeded."""
    base = tmp_path_factory.mktemp("export")
    model = seeded_encoder(SMALL, seed=123)
    checkpoint = base / "post-ln.pt"
    torch.save(model.state_dict(), checkpoint)
    messages: list[str] = []
    done = export_defaults(base / "models", checkpoint=checkpoint, config=SMALL, progress=messages.append)
    return Export(base / "models", done, messages, checkpoint, model)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_export_writes_version_1_of_each_model_and_leaves_no_staging_folder(exported: Export) -> None:
    expected = [*FILES, *(n.split("/")[0] for n in FILES), *(f"{d}/{f}" for d, fs in FILES.items() for f in fs)]
    assert _listing(exported.out) == sorted(expected)
    assert {p.name for p in exported.out.parent.iterdir()} == {"models", "post-ln.pt"}
    assert [(e.name, e.version, e.folder) for e in exported.exported] == [(n, 1, exported.out / n / "1") for n in NAMES]


def test_progress_reports_each_export_and_parity_figures(exported: Export) -> None:
    for name in NAMES:
        assert any(m.startswith(f"exporting {name} (") for m in exported.messages)
        assert any(m.startswith(f"parity {name}: torch ") and " numpy " in m for m in exported.messages)
    assert exported.messages[-1] == f"wrote layernorm/1, encoder/1, encoder-preln/1 to {exported.out}"


@pytest.mark.parametrize("name", NAMES)
def test_exported_model_passes_onnx_checker_and_is_self_contained(exported: Export, name: str) -> None:
    proto = onnx.load(str(exported.out / name / "1" / "model.onnx"))
    onnx.checker.check_model(proto, full_check=True)
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [18]
    assert not any(node.metadata_props for node in proto.graph.node), "stack traces hold paths of this checkout"


@pytest.mark.parametrize("name", NAMES)
def test_manifest_on_disk_is_the_returned_one_with_sorted_keys(exported: Export, name: str) -> None:
    text = (exported.out / name / "1" / "manifest.json").read_text()
    manifest = exported.manifest(name)
    assert json.loads(text) == manifest
    assert text == json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    assert (manifest["format_version"], manifest["name"], manifest["version"]) == (2, name, 1)
    assert manifest["normserve"] == app.__version__
    assert manifest["versions"] == {
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
    }


@pytest.mark.parametrize("name", NAMES)
def test_manifest_matches_the_files(exported: Export, name: str) -> None:
    entry = exported.manifest(name)
    folder = exported.out / name / "1"
    assert entry["files"] == {f: _sha256(folder / f) for f in FILES[f"{name}/1"] if f != "manifest.json"}
    assert entry["opset"] == 18
    parity = entry["parity"]
    assert 0 <= parity["onnx_vs_torch"] <= 1e-4 and 0 <= parity["onnx_vs_numpy"] <= 1e-4
    assert parity["tolerance"] == 1e-4 and parity["inputs"]
    if name == "layernorm":
        assert (entry["kind"], entry["config"]) == ("layernorm", {})
        assert set(entry) == MANIFEST_KEYS | {"normserve", "versions"}
    else:
        cfg = dataclasses.replace(SMALL, norm_first=ENCODERS[name])
        assert (entry["kind"], entry["config"]) == ("encoder", dataclasses.asdict(cfg))
        assert entry["layer_norms"] == layer_norm_names(cfg)
        assert set(entry) == MANIFEST_KEYS | {"normserve", "versions", "layer_norms"}


def test_the_manifests_have_the_committed_models_keys(exported: Export) -> None:
    for name in NAMES:
        committed = json.loads((ROOT / "models" / name / "1" / "manifest.json").read_text())
        assert set(exported.manifest(name)) == set(committed)


@pytest.mark.parametrize(
    ("name", "layers", "count", "inputs"),
    [
        ("layernorm", ["layernorm"], 24, "the seeded N(0,1) parity inputs' rows"),
        ("encoder", layer_norm_names(dataclasses.replace(SMALL, norm_first=False)), 60, None),
        ("encoder-preln", layer_norm_names(dataclasses.replace(SMALL, norm_first=True)), 60, None),
    ],
)
def test_each_layernorm_has_a_baseline_from_the_parity_inputs(
    exported: Export, name: str, layers: list[str], count: int, inputs: str | None
) -> None:
    baseline = exported.manifest(name)["baseline"]
    assert baseline["inputs"] == (inputs or "the parity inputs (parity.inputs), at unpadded positions")
    assert list(baseline["layers"]) == layers
    for layer in baseline["layers"].values():
        read = Baseline.from_json(layer)
        assert read.std.count == count  # the encoders' padded positions (3 + 7 + 16 of 3*7 + 1 + 2*32) left out
        assert list(read.std.quantiles) == sorted(read.std.quantiles) and read.std.quantiles[0] > 0


@pytest.mark.parametrize("name", NAMES)
def test_the_committed_models_have_a_baseline_for_each_layernorm(name: str) -> None:
    committed = json.loads((ROOT / "models" / name / "1" / "manifest.json").read_text())
    layers = committed.get("layer_norms", ["layernorm"])
    assert list(committed["baseline"]["layers"]) == layers
    assert all(Baseline.from_json(b).std.count > 0 for b in committed["baseline"]["layers"].values())


def test_layernorm_signature_in_manifest_and_graph(exported: Export) -> None:
    entry = exported.manifest("layernorm")
    fp32 = [("input", [-1, -1]), ("gamma", [-1]), ("beta", [-1]), ("eps_var", [-1, 1]), ("eps_std", [-1, 1])]
    assert entry["inputs"] == [{"name": n, "datatype": "FP32", "shape": s} for n, s in fp32]
    outputs = [("output", [-1, -1]), ("mean", [-1, 1]), ("inv_std_dev", [-1, 1])]
    assert entry["outputs"] == [{"name": n, "datatype": "FP32", "shape": s} for n, s in outputs]
    graph = onnx.load(str(exported.out / "layernorm" / "1" / "model.onnx")).graph
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input}
    assert dims == {
        "input": ["rows", "cols"],
        "gamma": ["cols"],
        "beta": ["cols"],
        "eps_var": ["rows", 1],
        "eps_std": ["rows", 1],
    }


@pytest.mark.parametrize("name", ["encoder", "encoder-preln"])
def test_encoder_signature_in_manifest_and_graph(exported: Export, name: str) -> None:
    entry = exported.manifest(name)
    assert entry["inputs"] == [
        {"name": "input", "datatype": "FP32", "shape": [-1, -1, 16]},
        {"name": "padding_mask", "datatype": "BOOL", "shape": [-1, -1]},
    ]
    cfg = dataclasses.replace(SMALL, norm_first=ENCODERS[name])
    names = ["output"] + [f"{n}.{s}" for n in layer_norm_names(cfg) for s in ("mean", "std")]
    assert names == output_names(layer_norm_names(cfg))
    assert [o["name"] for o in entry["outputs"]] == names
    assert [o["shape"] for o in entry["outputs"]] == [[-1, -1, 16]] + [[-1, -1]] * (len(names) - 1)
    graph = onnx.load(str(exported.out / name / "1" / "model.onnx")).graph
    assert [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input] == [
        ["batch", "seq", 16],
        ["batch", "seq"],
    ]


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (7, 3), (2, 300)])
def test_layernorm_runs_at_any_rows_and_cols(exported: Export, rows: int, cols: int) -> None:
    session = ort.InferenceSession(
        str(exported.out / "layernorm" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    x = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
    eps = np.full((rows, 1), 1e-5, np.float32)
    out, mean, inv_std_dev = session.run(
        None,
        {
            "input": x,
            "gamma": np.ones(cols, np.float32),
            "beta": np.zeros(cols, np.float32),
            "eps_var": eps,
            "eps_std": np.zeros_like(eps),
        },
    )
    assert (out.shape, mean.shape, inv_std_dev.shape) == ((rows, cols), (rows, 1), (rows, 1))
    np.testing.assert_allclose(mean[:, 0], x.mean(axis=1), atol=1e-6)


@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (4, 32), (2, 9)])
@pytest.mark.parametrize("name", ["encoder", "encoder-preln"])
def test_encoder_runs_at_any_batch_and_seq(exported: Export, name: str, batch: int, seq: int) -> None:
    session = ort.InferenceSession(str(exported.out / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(seq).standard_normal((batch, seq, 16)).astype(np.float32)
    outputs = session.run(None, {"input": x, "padding_mask": np.zeros((batch, seq), bool)})
    assert [o.shape for o in outputs] == [(batch, seq, 16)] + [(batch, seq)] * (len(outputs) - 1)


@pytest.mark.parametrize("name", ["encoder", "encoder-preln"])
def test_npz_weights_are_the_state_dict_in_float32(exported: Export, name: str) -> None:
    expected = (
        exported.checkpoint_model if name == "encoder" else seeded_encoder(dataclasses.replace(SMALL, norm_first=True))
    ).state_dict()
    with np.load(exported.out / name / "1" / "weights.npz", allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted(expected)
        for key in npz.files:
            assert npz[key].dtype == np.float32
            np.testing.assert_array_equal(npz[key], expected[key].numpy())


def test_checkpoint_round_trip_onnx_equals_torch_with_those_weights(exported: Export) -> None:
    session = ort.InferenceSession(
        str(exported.out / "encoder" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    x = np.random.default_rng(0).standard_normal((2, 6, 16)).astype(np.float32)
    mask = np.array([[False] * 6, [False] * 3 + [True] * 3])
    got = session.run(None, {"input": x, "padding_mask": mask})
    with torch.no_grad():
        expected = exported.checkpoint_model(torch.from_numpy(x), torch.from_numpy(mask))
        seeded = seeded_encoder(SMALL)(torch.from_numpy(x), torch.from_numpy(mask))
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e.numpy(), atol=1e-5)
    assert np.abs(got[0] - seeded[0].numpy()).max() > 1e-2, "the checkpoint's weights, not the seeded ones"


def test_a_rerun_gives_the_same_bytes_and_replaces_version_1_only(exported: Export, tmp_path: Path) -> None:
    again = tmp_path / "models"
    shutil.copytree(exported.out, again)
    (again / "layernorm" / "1" / "stale.onnx").write_text("left by an older export")
    shutil.copytree(again / "encoder" / "1", again / "encoder" / "2")  # a user's version of the same name
    export_defaults(again, checkpoint=exported.checkpoint, config=SMALL)
    assert {str(p.relative_to(again)): _sha256(p) for p in again.rglob("*") if p.is_file() and "/2" not in str(p)} == {
        str(p.relative_to(exported.out)): _sha256(p) for p in exported.out.rglob("*") if p.is_file()
    }
    assert Repository(again).versions("encoder") == [1, 2]


def _write_bad_checkpoint(path: Path, how: str) -> Path:
    state = seeded_encoder(SMALL).state_dict()
    if how == "renamed-key":
        state["layers.0.attn.c_attn.weight"] = state.pop("layers.0.attn.qkv.weight")
        torch.save(state, path)
    elif how == "wrong-d-model":
        torch.save(seeded_encoder(dataclasses.replace(SMALL, d_model=32)).state_dict(), path)
    elif how == "not-a-state-dict":
        torch.save([1, 2, 3], path)
    elif how == "pickled-model":
        torch.save(seeded_encoder(SMALL), path)
    else:
        path.write_text("not a checkpoint")
    return path


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("renamed-key", r"missing keys layers\.0\.attn\.qkv\.weight; unexpected keys layers\.0\.attn\.c_attn"),
        (
            "wrong-d-model",
            r"shape mismatch: layers\.0\.attn\.qkv\.weight \[96, 32\] != \[48, 16\], .* more\).*--d-model",
        ),
        ("not-a-state-dict", r"expected a state_dict \(a mapping of names to tensors\), got a list"),
        (
            "pickled-model",
            r"this is a whole module \(app\.export\.modules\.Encoder\), not a state_dict: use --module "
            r"\(`normserve export encoder --module`\)$",
        ),
        ("not-a-torch-file", r"not loadable with torch\.load\(weights_only=True\)"),
    ],
)
def test_mismatched_checkpoint_is_refused_with_a_clear_message(tmp_path: Path, how: str, message: str) -> None:
    path = _write_bad_checkpoint(tmp_path / "bad.pt", how)
    with pytest.raises(CheckpointError, match=message):
        export_defaults(tmp_path / "models", checkpoint=path, config=SMALL)
    assert not (tmp_path / "models").exists()


def test_cli_refuses_a_mismatched_checkpoint_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_bad_checkpoint(tmp_path / "bad.pt", "renamed-key")
    assert main(["--out-dir", str(tmp_path / "models"), "--checkpoint-preln", str(path), *SMALL_FLAGS]) == 1
    problems = (
        "missing keys layers.0.attn.qkv.weight, norm.bias, norm.weight; unexpected keys layers.0.attn.c_attn.weight"
    )
    assert capsys.readouterr().err == (
        f"normserve export: error: {path} does not fit the configured encoder ({problems}); "
        "check --d-model, --d-ff, --num-layers and the norm placement\n"
    )


def test_failed_parity_raises_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    with pytest.raises(
        ParityError, match=r"^parity failed for layernorm: onnx vs torch .* tolerance 1e-12; nothing written$"
    ):
        export_defaults(tmp_path / "models", config=SMALL, tolerance=1e-12)
    assert list(tmp_path.rglob("*")) == [tmp_path / "models"]
    with pytest.raises(ParityError):
        export_defaults(tmp_path / "fresh", config=SMALL, tolerance=1e-12)
    assert list(tmp_path.rglob("*")) == [tmp_path / "models"], "a repository the export created goes too"


def test_script_exits_non_zero_on_failed_parity_and_leaves_out_dir_unchanged(tmp_path: Path) -> None:
    out = tmp_path / "models"
    out.mkdir()
    (out / "layernorm" / "1").mkdir(parents=True)
    (out / "layernorm" / "1" / "manifest.json").write_text("{}")  # a previous export must survive a refused one
    script = ROOT / "scripts" / "export_onnx.py"
    result = subprocess.run(
        [sys.executable, str(script), "--out-dir", str(out), "--tolerance", "1e-12", *SMALL_FLAGS],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("normserve export: error: parity failed for layernorm")
    assert sorted(tmp_path.rglob("*")) == [
        out,
        out / "layernorm",
        out / "layernorm" / "1",
        out / "layernorm" / "1" / "manifest.json",
    ]
    assert (out / "layernorm" / "1" / "manifest.json").read_text() == "{}"


def test_torch_and_onnx_are_imported_only_under_app_export() -> None:
    offenders = []
    for path in (ROOT / "app").rglob("*.py"):
        if path.is_relative_to(ROOT / "app" / "export"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ("torch", "onnx")]
    assert offenders == []


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--opset", "17"], "opset 17 is not supported"),
        (["--num-heads", "3"], "divisible by num_heads 3"),
        (["--max-sequence-length", "1"], "max_sequence_length at least 2"),
    ],
)
def test_cli_refuses_an_unsupported_opset_or_config_before_exporting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    assert main(["--out-dir", str(tmp_path / "models"), *SMALL_FLAGS, *flags]) == 1
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
