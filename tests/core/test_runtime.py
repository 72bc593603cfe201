"""app/core/runtime.py: versions built from the repository by their kind's class, published, retired, looked up."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.core.encoder import EncoderModel
from app.core.layernorm import WARM_UP_ATOL, LayerNormModel
from app.core.model import ModelLoadError
from app.core.runtime import KINDS, Runtime, session_options
from app.core.textbatching import PooledTextEncoder
from app.core.versionstate import IndexRow, State, VersionState
from app.errors import InvalidInput, ModelNotFound
from app.settings import Settings
from tests.conftest import DEFAULT_MODELS
from tests.live_server import MODELS
from tests.repositories import add_version, copy_models, sha256sum_identity


@pytest.fixture
def models(tmp_path: Path) -> Path:
    """A copy of the repo's models/ to break or to add versions to."""
    return copy_models(tmp_path / "models")


def _manifest(models: Path, name: str, version: int = 1) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((models / name / str(version) / "manifest.json").read_text())
    return doc


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_kinds_name_each_class_by_its_kind() -> None:
    assert KINDS == {"layernorm": LayerNormModel, "encoder": EncoderModel, "text-encoder": PooledTextEncoder}


def test_load_builds_every_default_model_by_its_kinds_class(runtime: Runtime) -> None:
    assert [(m.name, m.version) for m in runtime.models] == [(name, "1") for name in DEFAULT_MODELS]
    for model in runtime.models:
        manifest = _manifest(MODELS, model.name)
        assert type(model) is KINDS[manifest["kind"]]
        assert model.path == MODELS / model.name / "1" / "model.onnx"
        assert manifest["files"]["model.onnx"] == _sha256(model.path)
        assert model.sha256 == sha256sum_identity(model.path.parent)  # over every file, once at load
        assert model.files == manifest["files"] and model.load_seconds > 0
        assert runtime.states[model.name, 1] == VersionState(State.READY)


@pytest.mark.parametrize("threads", [0, 1, 3])
def test_sessions_run_one_graph_at_a_time_with_the_configured_intra_op_threads(threads: int) -> None:
    opts = session_options(Settings(intra_op_threads=threads))
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (threads, 1)


def test_a_missing_repository_is_refused_saying_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as e:
        Runtime(Settings(model_dir=tmp_path / "nope")).load()
    assert str(e.value) == f"{tmp_path / 'nope'}: model repository missing; run `normserve export`"


def test_an_unknown_kind_is_refused_naming_the_folder_and_the_known_kinds(models: Path) -> None:
    manifest = _manifest(models, "encoder") | {"kind": "rnn"}
    (models / "encoder/1/manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError) as e:
        Runtime(Settings(model_dir=models)).build("encoder", 1)
    assert (
        str(e.value)
        == f"{models}/encoder/1: unknown kind 'rnn'; expected one of ['encoder', 'layernorm', 'text-encoder']"
    )


@pytest.mark.parametrize(("name", "file"), [("layernorm", "model.onnx"), ("encoder-preln", "weights.npz")])
def test_a_tampered_file_is_refused_by_its_sha256(models: Path, name: str, file: str) -> None:
    path = models / name / "1" / file
    path.write_bytes(path.read_bytes()[:-1])
    expected = _manifest(models, name)["files"][file]
    with pytest.raises(ModelLoadError) as e:
        Runtime(Settings(model_dir=models)).build(name, 1)
    assert str(e.value) == f"{path}: sha256 {_sha256(path)} does not match the manifest's {expected}"


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("model.onnx", "{dir}/model.onnx: model file missing"),
        ("manifest.json", "{dir}/manifest.json: manifest missing"),
    ],
)
def test_a_missing_file_is_refused_naming_it(models: Path, remove: str, message: str) -> None:
    (models / "encoder/1" / remove).unlink()
    with pytest.raises(ModelLoadError) as e:
        Runtime(Settings(model_dir=models)).build("encoder", 1)
    assert str(e.value) == message.format(dir=models / "encoder/1")


def test_a_manifest_of_another_format_is_refused(models: Path) -> None:
    (models / "layernorm/1/manifest.json").write_text(
        json.dumps(_manifest(models, "layernorm") | {"format_version": 1})
    )
    with pytest.raises(ModelLoadError) as e:
        Runtime(Settings(model_dir=models)).build("layernorm", 1)
    assert str(e.value) == (
        f"{models}/layernorm/1: unreadable manifest ({models}/layernorm/1/manifest.json: "
        "format_version 1; this server reads 2)"
    )


def test_without_a_version_the_highest_serving_one_answers(models: Path) -> None:
    add_version(models, "layernorm", 3)
    runtime = Runtime(Settings(model_dir=models))
    one, three = runtime.build("layernorm", 1), runtime.build("layernorm", 3)
    runtime.publish(one)
    assert runtime.get("layernorm") is one
    runtime.publish(three)
    assert runtime.get("layernorm") is three and runtime.get("layernorm", "1") is one and runtime.get("layernorm", 3)
    assert runtime.retire("layernorm", 3) is three
    assert runtime.get("layernorm") is one and runtime.states["layernorm", 3] == VersionState(
        State.UNAVAILABLE, "unloaded"
    )
    assert runtime.retire("layernorm", 3) is None  # twice: nothing more to retire


def _batcher_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"batcher-{name}"]


def test_a_version_reloaded_in_place_closes_the_one_it_replaces(models: Path) -> None:
    """Poll mode reloads a version whose files changed; the replaced model's batcher thread ends (it held the
    old session alive: one thread and one session leaked per reload)."""
    runtime = Runtime(Settings(model_dir=models), in_flight=lambda: 2)  # another request in flight: hand off
    others = set(_batcher_threads("encoder/1"))  # other tests' runtimes serve an encoder/1 too
    runtime.put_in_service(runtime.build_versions("encoder", [1], runtime.repository.policy("encoder")))
    old = runtime.get("encoder")
    assert isinstance(old, EncoderModel) and old.batcher is not None
    x = np.zeros((1, 4, old.config.d_model), np.float32)
    old.batcher.run(x, np.zeros((1, 4), bool), ["output"])  # waits the delay for the other, then runs alone
    (thread,) = set(_batcher_threads("encoder/1")) - others
    runtime.put_in_service(runtime.build_versions("encoder", [1], runtime.repository.policy("encoder")))
    assert runtime.get("encoder") is not old
    thread.join(timeout=10)
    assert not thread.is_alive()


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("nope", None, "model: unknown model 'nope'; available: encoder, encoder-preln, layernorm"),
        ("LayerNorm", None, "model: unknown model 'LayerNorm'; available: encoder, encoder-preln, layernorm"),
        ("layernorm", "2", "version: model 'layernorm' has no ready version '2'; ready: 1"),
    ],
    ids=["unknown-model", "names-are-case-sensitive", "unknown-version"],
)
def test_get_of_an_unknown_model_or_version_is_model_not_found(
    runtime: Runtime, name: str, version: str | None, message: str
) -> None:
    with pytest.raises(ModelNotFound) as e:
        runtime.get(name, version)
    assert str(e.value) == message


@pytest.mark.parametrize(
    ("name", "version", "field"),
    [("../x", None, "model"), ("a" * 65, None, "model"), ("/etc", None, "model"), ("layernorm", "0", "version")]
    + [("layernorm", v, "version") for v in ("-1", "1e9", "01", " 1", "99999999999", "1.0")],
)
def test_get_refuses_names_and_versions_no_folder_can_have(
    runtime: Runtime, name: str, version: str | None, field: str
) -> None:
    with pytest.raises(InvalidInput) as e:
        runtime.get(name, version)
    assert e.value.field == field


def test_warm_up_gives_each_models_figure_under_its_own_tolerance() -> None:
    runtime = Runtime(Settings(model_dir=MODELS, validate_atol=5e-5))
    figures = {name: runtime.warm_up(runtime.build(name, 1)) for name in DEFAULT_MODELS}
    assert {name: atol for name, (_, atol) in figures.items()} == {
        "encoder": 5e-5,
        "encoder-preln": 5e-5,
        "layernorm": WARM_UP_ATOL,
    }
    assert all(0 < diff <= atol for diff, atol in figures.values())


def test_warm_up_past_a_tolerance_is_refused_naming_the_model_file() -> None:
    runtime = Runtime(Settings(model_dir=MODELS, validate_atol=1e-12, batch_max_size=1))
    model = runtime.build("encoder", 1)
    diff, _ = model.warm_up()
    with pytest.raises(ModelLoadError) as e:
        runtime.warm_up(model)
    assert str(e.value) == f"{MODELS}/encoder/1/model.onnx: parity warm-up failed, max abs diff {diff:.3g} > 1e-12"


def test_version_states_are_tritons_and_read_only_outside_the_runtime(models: Path) -> None:
    assert [s.value for s in State] == ["READY", "UNAVAILABLE", "LOADING", "UNLOADING"]
    runtime = Runtime(Settings(model_dir=models))
    runtime.publish(runtime.build("layernorm", 1))
    with pytest.raises(TypeError) as e:
        runtime.states["layernorm", 1] = VersionState(State.UNAVAILABLE)  # type: ignore[index]
    assert str(e.value) == "'mappingproxy' object does not support item assignment"
    assert runtime.states["layernorm", 1] == VersionState(State.READY)


def test_built_versions_are_loading_until_they_serve_or_a_failed_start_abandons_them(models: Path) -> None:
    add_version(models, "layernorm", 2)
    runtime = Runtime(Settings(model_dir=models))
    policy = runtime.repository.policy("layernorm")
    built = runtime.build_versions("layernorm", [2, 1], policy)
    assert runtime.index()[-2:] == [
        IndexRow("layernorm", 1, State.LOADING, ""),
        IndexRow("layernorm", 2, State.LOADING, ""),
    ]
    runtime.put_in_service(built[:1])
    runtime.abandon("not loaded: the encoder failed")
    assert runtime.index()[-2:] == [
        IndexRow("layernorm", 1, State.UNAVAILABLE, "not loaded: the encoder failed"),
        IndexRow("layernorm", 2, State.READY, ""),
    ]


def test_a_version_failing_its_build_takes_those_built_with_it_down_and_says_why(models: Path) -> None:
    add_version(models, "layernorm", 2)
    (models / "layernorm" / "1" / "manifest.json").unlink()
    runtime = Runtime(Settings(model_dir=models))
    with pytest.raises(ModelLoadError) as e:
        runtime.build_versions("layernorm", [2, 1], runtime.repository.policy("layernorm"))
    assert str(e.value) == f"{models}/layernorm/1/manifest.json: manifest missing"
    assert runtime.index()[-2:] == [
        IndexRow("layernorm", 1, State.UNAVAILABLE, "layernorm/1/manifest.json: manifest missing"),
        IndexRow("layernorm", 2, State.UNAVAILABLE, "version 1 failed"),
    ]
    assert "layernorm" not in runtime.serving
