"""app/core/runtime.py: the manifest's models verified and built by their kind's class, looked up, warmed up."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.core.encoder import EncoderModel
from app.core.layernorm import WARM_UP_ATOL, LayerNormModel
from app.core.model import ModelLoadError
from app.core.runtime import KINDS, MANIFEST, Runtime, session_options
from app.errors import ModelNotFound
from app.settings import Settings
from tests.live_server import MODELS

NAMES = ["encoder", "encoder-preln", "layernorm"]


@pytest.fixture
def models(tmp_path: Path) -> Path:
    """A copy of the repo's models/ to break."""
    return Path(shutil.copytree(MODELS, tmp_path / "models"))


def _edit_manifest(models: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads((models / MANIFEST).read_text())
    edit(manifest["models"])
    (models / MANIFEST).write_text(json.dumps(manifest))


def _load(models: Path, **settings: Any) -> Runtime:
    runtime = Runtime(Settings(model_dir=models, **settings))
    runtime.load()
    return runtime


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_kinds_name_each_class_by_its_kind() -> None:
    assert KINDS == {"layernorm": LayerNormModel, "encoder": EncoderModel}


def test_load_builds_every_model_of_the_manifest_by_its_kinds_class() -> None:
    runtime = _load(MODELS)
    manifest = json.loads((MODELS / MANIFEST).read_text())["models"]
    assert sorted(runtime.models) == sorted(manifest) == NAMES
    for name, model in runtime.models.items():
        entry = manifest[name]
        assert type(model) is KINDS[entry["kind"]]
        assert (model.name, model.version, model.sha256) == (name, entry["version"], entry["sha256"])
        assert model.path == MODELS / entry["file"] and model.sha256 == _sha256(model.path)
        assert model.load_seconds > 0


@pytest.mark.parametrize("threads", [0, 1, 3])
def test_sessions_run_one_graph_at_a_time_with_the_configured_intra_op_threads(threads: int) -> None:
    opts = session_options(Settings(intra_op_threads=threads))
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (threads, 1)


def test_a_directory_without_a_manifest_is_refused(tmp_path: Path) -> None:
    runtime = Runtime(Settings(model_dir=tmp_path))
    with pytest.raises(ModelLoadError) as e:
        runtime.load()
    assert str(e.value) == f"{tmp_path / MANIFEST}: manifest missing; run `normserve export`"
    assert runtime.models == {}


def test_an_unknown_kind_is_refused_naming_the_model_and_the_known_kinds(models: Path) -> None:
    _edit_manifest(models, lambda m: m["encoder"].update(kind="rnn"))
    with pytest.raises(ModelLoadError) as e:
        _load(models)
    assert str(e.value) == "encoder: unknown kind 'rnn'; expected one of ['encoder', 'layernorm']"


def test_a_tampered_model_file_is_refused_by_its_sha256(models: Path) -> None:
    path = models / "layernorm.onnx"
    with path.open("ab") as f:
        f.write(b"\0")
    expected = json.loads((models / MANIFEST).read_text())["models"]["layernorm"]["sha256"]
    with pytest.raises(ModelLoadError) as e:
        _load(models)
    assert str(e.value) == f"{path}: sha256 {_sha256(path)} does not match the manifest's {expected}"


def test_tampered_encoder_weights_are_refused_by_their_sha256(models: Path) -> None:
    path = models / "encoder-preln.npz"
    path.write_bytes(path.read_bytes()[:-1])
    expected = json.loads((models / MANIFEST).read_text())["models"]["encoder-preln"]["weights"]["sha256"]
    with pytest.raises(ModelLoadError) as e:
        _load(models)
    assert str(e.value) == f"{path}: sha256 {_sha256(path)} does not match the manifest's {expected}"


def test_a_missing_model_file_is_refused(models: Path) -> None:
    (models / "encoder.onnx").unlink()
    with pytest.raises(ModelLoadError) as e:
        _load(models)
    assert str(e.value) == f"{models / 'encoder.onnx'}: model file missing"


def test_get_returns_each_model_by_name_and_by_its_version(runtime: Runtime) -> None:
    for name in NAMES:
        model = runtime.get(name)
        assert model.name == name
        assert runtime.get(name, "1") is model


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("nope", None, "model: unknown model 'nope'; available: encoder, encoder-preln, layernorm"),
        ("LayerNorm", None, "model: unknown model 'LayerNorm'; available: encoder, encoder-preln, layernorm"),
        ("nope", "1", "model: unknown model 'nope'; available: encoder, encoder-preln, layernorm"),
        ("layernorm", "2", "version: model 'layernorm' has no version '2'; available: 1"),
        ("encoder", "", "version: model 'encoder' has no version ''; available: 1"),
    ],
    ids=["unknown-model", "names-are-case-sensitive", "unknown-model-and-version", "unknown-version", "empty-version"],
)
def test_get_of_an_unknown_model_or_version_is_model_not_found(
    runtime: Runtime, name: str, version: str | None, message: str
) -> None:
    with pytest.raises(ModelNotFound) as e:
        runtime.get(name, version)
    assert str(e.value) == message


def test_get_before_load_says_no_model_is_available() -> None:
    with pytest.raises(ModelNotFound) as e:
        Runtime(Settings(model_dir=MODELS)).get("layernorm")
    assert str(e.value) == "model: unknown model 'layernorm'; available: none"


def test_warm_up_gives_each_models_figure_under_its_own_tolerance() -> None:
    runtime = _load(MODELS, validate_atol=5e-5)
    figures = runtime.warm_up()
    assert sorted(figures) == NAMES
    assert {name: atol for name, (_, atol) in figures.items()} == {
        "encoder": 5e-5,
        "encoder-preln": 5e-5,
        "layernorm": WARM_UP_ATOL,
    }
    assert all(0 < diff <= atol for diff, atol in figures.values())
    assert figures == {name: model.warm_up() for name, model in runtime.models.items()}  # fixed inputs


def test_warm_up_past_a_tolerance_is_refused_naming_the_model_file() -> None:
    runtime = _load(MODELS, validate_atol=1e-12, batch_max_size=1)
    diff, _ = runtime.get("encoder").warm_up()  # the first model the warm-up runs (manifest order)
    with pytest.raises(ModelLoadError) as e:
        runtime.warm_up()
    assert str(e.value) == f"{MODELS / 'encoder.onnx'}: parity warm-up failed, max abs diff {diff:.3g} > 1e-12"
