"""app/core/model.py: V2 tensor specs, the sha256 check of a file, and what every loaded model does (metadata, run)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from app.core.dataplane import Fields, ModelInfo
from app.core.encoder import EncoderModel
from app.core.layernorm import LayerNormModel
from app.core.model import (
    PLATFORM,
    Loaded,
    Model,
    ModelLoadError,
    TensorSpec,
    describe,
    positive_float,
    positive_int,
    sha256_of,
    verify,
    version_sha256,
)
from app.core.runtime import Runtime
from app.errors import InvalidInput
from app.server.api.v2.http.codec import FIELDS as V2_FIELDS
from app.settings import Settings
from tests.live_server import MODELS
from tests.repositories import sha256sum_identity

Run = tuple[str, str, float, int, bool]


def _entry(name: str) -> dict[str, Any]:
    """A default model's manifest as the runtime hands it to a kind: with its name, version and sha256."""
    manifest: dict[str, Any] = json.loads((MODELS / name / "1" / "manifest.json").read_text())
    return {**manifest, "name": name, "version": "1", "sha256": manifest["files"]["model.onnx"]}


def _layernorm(entry: dict[str, Any], runs: list[Run]) -> LayerNormModel:
    """The layernorm kind on the repo's graph, as the runtime builds it, telling `runs` of every run."""
    path = MODELS / "layernorm" / "1" / "model.onnx"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    settings = Settings(model_dir=MODELS)
    return LayerNormModel(Loaded(entry, path, session, settings, lambda *run: runs.append(run)))


def _rows(rows: int, cols: int) -> dict[str, np.ndarray]:
    """Feeds of the layernorm graph: `rows` random rows, eps 1e-5 in mode var."""
    x = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
    eps = np.full((rows, 1), 1e-5, np.float32)
    ones, zeros = np.ones(cols, np.float32), np.zeros(cols, np.float32)
    return {"input": x, "gamma": ones, "beta": zeros, "eps_var": eps, "eps_std": np.zeros_like(eps)}


@pytest.mark.parametrize(
    ("spec", "metadata"),
    [
        (TensorSpec("input", ("FP32", "FP64"), (-1,)), {"name": "input", "datatype": "FP32", "shape": [-1]}),
        (
            TensorSpec("padding_mask", ("BOOL",), (-1, -1), optional=True),
            {"name": "padding_mask", "datatype": "BOOL", "shape": [-1, -1]},
        ),
        (
            TensorSpec("output", ("FP64", "FP32"), (-1, -1, 128)),
            {"name": "output", "datatype": "FP64", "shape": [-1, -1, 128]},
        ),
    ],
    ids=["first-datatype-reported", "optional-not-reported", "fixed-dim"],
)
def test_tensor_spec_metadata_is_the_v2_view(spec: TensorSpec, metadata: dict[str, Any]) -> None:
    assert spec.metadata() == metadata


@pytest.mark.parametrize("size", [0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 3 * (1 << 20) + 17])
def test_sha256_of_equals_hashlib_at_any_size(tmp_path: Path, size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_of(path) == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("name", ["layernorm", "encoder", "encoder-preln"])
def test_version_identity_is_sha256sum_over_every_file_in_name_order(name: str) -> None:
    files = _entry(name)["files"]
    backwards = dict(reversed(files.items()))  # the manifest's order does not matter, the names' does
    assert version_sha256(backwards) == version_sha256(files) == sha256sum_identity(MODELS / name / "1")


@pytest.mark.parametrize("file", ["model.onnx", "weights.npz"])
def test_version_identity_changes_with_any_file(file: str) -> None:
    files = _entry("encoder")["files"]
    assert version_sha256({**files, file: hashlib.sha256(b"retrained").hexdigest()}) != version_sha256(files)


def test_verify_accepts_the_shipped_file_with_its_manifest_sha256() -> None:
    for file, sha256 in _entry("encoder")["files"].items():
        verify(MODELS / "encoder" / "1" / file, sha256)


def test_verify_refuses_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "layernorm.onnx"
    with pytest.raises(ModelLoadError) as e:
        verify(path, _entry("layernorm")["sha256"])
    assert str(e.value) == f"{path}: model file missing"


def test_verify_refuses_a_directory_in_place_of_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as e:
        verify(tmp_path, "0" * 64)
    assert str(e.value) == f"{tmp_path}: model file missing"


def test_verify_refuses_a_tampered_file_naming_both_sha256(tmp_path: Path) -> None:
    path = tmp_path / "layernorm.onnx"
    shutil.copyfile(MODELS / "layernorm" / "1" / "model.onnx", path)
    with path.open("ab") as f:
        f.write(b"\0")
    expected = _entry("layernorm")["sha256"]
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(ModelLoadError) as e:
        verify(path, expected)
    assert str(e.value) == f"{path}: sha256 {actual} does not match the manifest's {expected}"


def test_model_identity_comes_from_its_manifest_entry() -> None:
    entry = _entry("layernorm")
    model = _layernorm(entry, [])
    assert model.info == ModelInfo("layernorm", "1", entry["sha256"])
    assert (model.name, model.version, model.sha256) == ("layernorm", "1", entry["sha256"])
    assert model.parity == entry["parity"] and model.path == MODELS / "layernorm" / "1" / "model.onnx"


def test_model_version_defaults_to_1_when_the_entry_has_none() -> None:
    entry = {k: v for k, v in _entry("layernorm").items() if k not in ("version", "parity")}
    model = _layernorm(entry, [])
    assert (model.version, model.parity) == ("1", {})


def test_metadata_is_built_once_and_reports_the_kinds_tensors() -> None:
    model = _layernorm(_entry("layernorm"), [])
    metadata = model.metadata
    assert model.metadata is metadata
    assert metadata == {
        "name": "layernorm",
        "versions": ["1"],
        "platform": PLATFORM,
        "inputs": [
            {"name": "input", "datatype": "FP32", "shape": [-1, -1]},
            {"name": "gamma", "datatype": "FP32", "shape": [-1]},
            {"name": "beta", "datatype": "FP32", "shape": [-1]},
        ],
        "outputs": [
            {"name": "output", "datatype": "FP32", "shape": [-1, -1]},
            {"name": "mean", "datatype": "FP32", "shape": [-1]},
            {"name": "inv_std_dev", "datatype": "FP32", "shape": [-1]},
        ],
    }


@pytest.mark.parametrize(("rows", "cols"), [(1, 8), (3, 5), (40, 2)])
def test_run_tells_the_observer_name_version_seconds_rows_and_no_warm_up(rows: int, cols: int) -> None:
    runs: list[Run] = []
    model = _layernorm({**_entry("layernorm"), "version": "7"}, runs)
    start = time.perf_counter()
    out, mean = model.run(_rows(rows, cols), ["output", "mean"])
    elapsed = time.perf_counter() - start
    assert (out.shape, mean.shape) == ((rows, cols), (rows, 1))
    [(name, version, seconds, observed_rows, warm_up)] = runs
    assert (name, version, observed_rows, warm_up) == ("layernorm", "7", rows, False)
    assert 0 < seconds <= elapsed


def test_run_with_no_output_names_returns_every_output() -> None:
    runs: list[Run] = []
    outputs = _layernorm(_entry("layernorm"), runs).run(_rows(2, 4))
    assert [o.shape for o in outputs] == [(2, 4), (2, 1), (2, 1)]
    assert len(runs) == 1


def test_a_runtime_observer_is_told_of_each_encoder_run_with_its_batch() -> None:
    runs: list[Run] = []
    runtime = Runtime(Settings(model_dir=MODELS, batch_max_size=1), observe=lambda *run: runs.append(run))
    model = runtime.build("encoder-preln", 1)  # not warmed up: the run below is the observer's only one
    assert isinstance(model, EncoderModel)
    x = np.zeros((3, 5, model.config.d_model), np.float32)
    model.run({"input": x, "padding_mask": np.zeros((3, 5), bool)}, ["output"])
    [(name, version, seconds, rows, warm_up)] = runs
    assert (name, version, rows, warm_up) == ("encoder-preln", "1", 3, False) and seconds > 0


@pytest.mark.parametrize("name", ["layernorm", "encoder"])
def test_the_runtimes_warm_up_tells_the_observer_each_run_is_the_warm_ups(name: str) -> None:
    runs: list[Run] = []
    runtime = Runtime(Settings(model_dir=MODELS, batch_max_size=1), observe=lambda *run: runs.append(run))
    model = runtime.build(name, 1)
    runtime.warm_up(model)
    assert runs and all(run[4] for run in runs)
    assert model.warming is False  # what runs next is a client's


@pytest.mark.parametrize(
    ("model_name", "tensors", "message"),
    [
        ("layernorm", {"gamma"}, "inputs.input: required input missing for model 'layernorm'"),
        ("encoder", {"padding_mask"}, "inputs.input: required input missing for model 'encoder'"),
    ],
)
def test_check_tensors_refuses_a_missing_required_input(
    runtime: Runtime, model_name: str, tensors: set[str], message: str
) -> None:
    model = runtime.get(model_name)
    with pytest.raises(InvalidInput) as e:
        model.check_tensors({name: np.zeros(1) for name in tensors}, V2_FIELDS)
    assert str(e.value) == message


@pytest.mark.parametrize("model_name", ["layernorm", "encoder"])
def test_check_tensors_accepts_the_required_inputs_alone(runtime: Runtime, model_name: str) -> None:
    model: Model = runtime.get(model_name)
    model.check_tensors({"input": np.zeros(1)}, Fields())


# ---- load-time checks of a manifest's config ---------------------------------------------------------------------

WHERE = Path("m/1/manifest.json")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "m/1/manifest.json: config.d_model 0; expected a positive integer"),
        (-3, "m/1/manifest.json: config.d_model -3; expected a positive integer"),
        (True, "m/1/manifest.json: config.d_model True; expected a positive integer"),
        (2.0, "m/1/manifest.json: config.d_model 2.0; expected a positive integer"),
        (None, "m/1/manifest.json: config.d_model None; expected a positive integer"),
    ],
)
def test_a_size_that_is_not_a_positive_integer_is_a_load_error_naming_the_field(value: object, message: str) -> None:
    with pytest.raises(ModelLoadError) as e:
        positive_int({"d_model": value}, "d_model", WHERE)
    assert str(e.value) == message


@pytest.mark.parametrize("value", [0, -1e-5, float("inf"), float("nan"), "1e-5", False])
def test_an_eps_that_is_not_positive_and_finite_is_a_load_error(value: object) -> None:
    with pytest.raises(ModelLoadError) as e:
        positive_float({"eps": value}, "eps", WHERE, 1e-5)
    assert str(e.value) == f"m/1/manifest.json: config.eps {value!r}; expected a positive finite number"


def test_an_absent_eps_is_the_default() -> None:
    assert positive_float({}, "eps", WHERE, 1e-5) == 1e-5


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (RecursionError("maximum recursion depth exceeded"), "nested too deeply"),
        (KeyError("layers.0.norm1.weight"), "KeyError: 'layers.0.norm1.weight'"),
        (ZeroDivisionError(), "ZeroDivisionError"),
        (ValueError("x" * 1000), "ValueError: " + "x" * 299 + "…"),
    ],
    ids=["recursion", "key", "no-text", "long"],
)
def test_an_unexpected_load_error_is_described_by_its_class_and_300_characters(error: Exception, text: str) -> None:
    assert describe(error) == text
