"""app/server/control.py: loads by version policy, failures that change nothing, unloads that let requests finish, poll."""

from __future__ import annotations

import ast
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.core import reference
from app.core.dataplane import EncodeInput, NormalizeInput
from app.core.encoder import EncoderModel
from app.core.model import ModelLoadError, sha256_of
from app.core.runtime import Runtime
from app.core.versionstate import State
from app.errors import ModelControlDisabled, ModelLoadFailed, ModelNotFound
from app.server.control import ModelControl
from app.settings import Settings
from tests.repositories import add_version, copy_models


def _control(root: Path, **settings: Any) -> ModelControl:
    return ModelControl(Runtime(Settings(model_dir=root, **settings)))


def _states(control: ModelControl, name: str) -> list[tuple[str, str, str]]:
    return [(str(r.version), r.state, r.reason) for r in control.runtime.index() if r.name == name]


def _serving(control: ModelControl, name: str) -> list[int]:
    return sorted(control.runtime.serving.get(name, {}))


def _tamper(folder: Path) -> Path:
    path = folder / "model.onnx"
    with path.open("ab") as f:
        f.write(b"\0")
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return copy_models(tmp_path / "models", ("layernorm", "encoder"))


def test_load_serves_the_policys_versions_then_retires_the_others(root: Path) -> None:
    control = _control(root)
    control.load("layernorm")
    assert _serving(control, "layernorm") == [1] and _states(control, "layernorm") == [("1", "READY", "")]
    add_version(root, "layernorm", 2)
    (root / "layernorm/model.json").write_text(json.dumps({"version_policy": {"latest": {"num_versions": 2}}}))
    assert [m.version for m in control.load("layernorm")] == ["2"]
    assert _serving(control, "layernorm") == [1, 2] and control.runtime.get("layernorm").version == "2"
    (root / "layernorm/model.json").write_text(json.dumps({"version_policy": {"specific": {"versions": [2]}}}))
    assert control.load("layernorm") == []  # nothing new to build: version 1 is only retired
    assert control.runtime.get("layernorm").version_policy == {"specific": {"versions": [2]}}  # the config's
    assert _states(control, "layernorm") == [
        ("1", "UNAVAILABLE", "not selected by the version_policy any more"),
        ("2", "READY", ""),
    ]


def test_an_unload_shows_unloading_until_the_version_is_closed(root: Path) -> None:
    """Triton's UNLOADING: the version takes no new request from the start of its unload, and the index says so
    until it is closed (here its batcher, told to merge no more, waits on the lock this test holds)."""
    control = _control(root)
    control.load("encoder")
    model = control.runtime.get("encoder")
    assert isinstance(model, EncoderModel) and model.batcher is not None
    unload = threading.Thread(target=control.unload, args=("encoder",))
    with model.batcher._cond:
        unload.start()
        deadline = time.monotonic() + 10
        while control.runtime.states["encoder", 1].state is not State.UNLOADING and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _states(control, "encoder") == [("1", "UNLOADING", "")]
        with pytest.raises(ModelNotFound):
            control.runtime.get("encoder")
    unload.join(timeout=10)
    assert _states(control, "encoder") == [("1", "UNAVAILABLE", "unloaded")]


def _state_writes(path: Path) -> list[str]:
    """Where a module assigns into a `states` mapping or touches the Runtime's own `_states`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            value = target.value if isinstance(target, ast.Subscript) else None
            if isinstance(value, ast.Attribute) and value.attr in ("states", "_states"):
                found.append(f"{path.name}:{node.lineno}")
        if isinstance(node, ast.Attribute) and node.attr == "_states":
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_only_the_runtime_writes_version_states() -> None:
    """A complement to the behaviour above: no module but app/core/runtime.py writes a version's state."""
    app = Path(__file__).resolve().parents[2] / "app"
    others = [p for p in sorted(app.rglob("*.py")) if p != app / "core" / "runtime.py"]
    assert [w for p in others for w in _state_writes(p)] == []
    assert _state_writes(app / "core" / "runtime.py") != []  # the check sees the writes where they are


def test_a_failed_load_changes_nothing_that_serves_and_says_why(root: Path) -> None:
    control = _control(root)
    control.load("layernorm")
    path = _tamper(add_version(root, "layernorm", 2))
    expected = json.loads((root / "layernorm/2/manifest.json").read_text())["files"]["model.onnx"]
    reason = f"{path.relative_to(root)}: sha256 {sha256_of(path)} does not match the manifest's {expected}"
    with pytest.raises(ModelLoadFailed) as e:
        control.load("layernorm")
    assert str(e.value) == f"failed to load model 'layernorm': {reason}"
    assert _serving(control, "layernorm") == [1]
    assert _states(control, "layernorm") == [("1", "READY", ""), ("2", "UNAVAILABLE", reason)]


def test_a_version_failing_its_warm_up_never_serves(root: Path) -> None:
    control = _control(root, validate_atol=1e-12, batch_max_size=1)
    with pytest.raises(ModelLoadFailed) as e:
        control.load("encoder")
    assert "parity warm-up failed, max abs diff" in str(e.value) and str(e.value).endswith(" > 1e-12")
    assert _serving(control, "encoder") == [] and _states(control, "encoder")[0][:2] == ("1", "UNAVAILABLE")


def test_unload_lets_a_request_holding_the_version_finish_on_it(root: Path) -> None:
    control = _control(root)
    control.load("layernorm")
    control.load("encoder")
    held_ln, held_enc = control.runtime.get("layernorm"), control.runtime.get("encoder")
    assert control.unload("layernorm") == [1] and control.unload("encoder") == [1]
    with pytest.raises(ModelNotFound):
        control.runtime.get("layernorm")
    x = np.array([[1.0, 2.0, 4.0]], np.float32)
    out = held_ln.infer(NormalizeInput(x))  # the session lives while a request holds it
    np.testing.assert_allclose(out.output, reference.layer_norm(x, 1, 1e-5, "var").output, atol=1e-6)
    enc = held_enc.infer(EncodeInput(np.zeros((1, 3, 128), np.float32), None, held_enc.limits))  # type: ignore[attr-defined]
    assert enc.output.shape == (1, 3, 128)  # its batcher is closed: the run goes alone
    assert _states(control, "layernorm") == [("1", "UNAVAILABLE", "unloaded")]


def test_unload_of_a_name_the_repository_does_not_have_is_not_found(root: Path) -> None:
    with pytest.raises(ModelNotFound) as e:
        _control(root).unload("nope")
    assert str(e.value) == "model: no model 'nope' in the repository; available: encoder, layernorm"


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_the_repository_api_loads_only_in_explicit_mode(root: Path, mode: str) -> None:
    with pytest.raises(ModelControlDisabled) as e:
        _control(root, model_control=mode).check_explicit("load", "layernorm")
    assert str(e.value) == (
        f"cannot load model 'layernorm': NORMSERVE_MODEL_CONTROL is '{mode}'; the repository API loads and unloads "
        "models only with NORMSERVE_MODEL_CONTROL=explicit"
    )
    _control(root, model_control="explicit").check_explicit("load", "layernorm")


@pytest.mark.parametrize(
    ("mode", "startup", "names"),
    [
        ("none", "", ["encoder", "layernorm"]),
        ("explicit", "*", ["encoder", "layernorm"]),
        ("explicit", "layernorm", ["layernorm"]),
        ("explicit", " ", []),
        ("poll", "layernorm", ["encoder", "layernorm"]),
    ],
)
def test_the_models_loaded_at_start_follow_the_mode(root: Path, mode: str, startup: str, names: list[str]) -> None:
    assert _control(root, model_control=mode, startup_models=startup).startup_names() == names


def test_startup_models_must_be_in_the_repository(root: Path) -> None:
    with pytest.raises(ModelLoadError) as e:
        _control(root, model_control="explicit", startup_models="layernorm,nope,gone").startup_names()
    assert str(e.value) == "NORMSERVE_STARTUP_MODELS names nope, gone: not in the repository"


def test_poll_follows_the_folder(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    control = _control(root, model_control="poll")
    for name in control.startup_names():
        control.load(name)
    add_version(root, "layernorm", 2)
    control.poll()
    assert _serving(control, "layernorm") == [2]
    bad = _tamper(add_version(root, "encoder", 2))
    control.poll()
    assert _serving(control, "encoder") == [1] and _states(control, "encoder")[1][1] == "UNAVAILABLE"
    assert f"model encoder version 2 failed to load: {bad.relative_to(root)}: sha256" in caplog.text
    caplog.clear()
    control.poll()  # unchanged since it failed: not tried again
    assert "failed to load" not in caplog.text
    shutil.copyfile(root / "encoder/1/model.onnx", bad)  # fixed in place: tried again, and it serves
    control.poll()
    assert _serving(control, "encoder") == [2]
    shutil.rmtree(root / "layernorm")
    control.poll()
    assert "layernorm" not in control.runtime.serving


def test_poll_reloads_a_serving_version_changed_in_place(root: Path) -> None:
    control = _control(root, model_control="poll")
    control.load("layernorm")
    before = control.runtime.get("layernorm")
    manifest = root / "layernorm/1/manifest.json"
    manifest.write_text(manifest.read_text() + "\n")
    os.utime(manifest, ns=(1, 1))  # a new stamp even where the clock is coarse
    control.poll()
    after = control.runtime.get("layernorm")
    assert after is not before and after.version == "1"


def test_poll_loads_a_model_folder_put_back_as_it_was(root: Path, tmp_path: Path) -> None:
    control = _control(root, model_control="poll")
    control.load("layernorm")
    shutil.move(root / "layernorm", tmp_path / "away")  # a rename keeps every file's size and mtime
    control.poll()
    assert "layernorm" not in control.runtime.serving
    shutil.move(tmp_path / "away", root / "layernorm")
    control.poll()
    assert _serving(control, "layernorm") == [1] and _states(control, "layernorm") == [("1", "READY", "")]


@pytest.mark.parametrize(("kept", "serving"), [((), []), ((1,), [1])], ids=["every-version", "the-newest"])
def test_poll_unloads_a_version_whose_folder_is_removed(
    root: Path, tmp_path: Path, kept: tuple[int, ...], serving: list[int]
) -> None:
    """Also when no version is left for the policy to select: the model then serves nothing, as if removed."""
    (root / "layernorm/model.json").write_text(json.dumps({"version_policy": {"all": {}}}))
    add_version(root, "layernorm", 2)
    control = _control(root, model_control="poll")
    control.load("layernorm")
    for version in {1, 2} - set(kept):
        shutil.move(root / f"layernorm/{version}", tmp_path / f"v{version}")
    control.poll()
    assert _serving(control, "layernorm") == serving
    assert [r.version for r in control.runtime.index() if r.name == "layernorm"] == list(kept)


def test_a_file_linking_outside_the_repository_fails_its_load_unread(root: Path, tmp_path: Path) -> None:
    """Its sha256 is never taken: a reason that carried it would tell a client the digest of any file outside."""
    control = _control(root)
    control.load("encoder")
    (tmp_path / "secret.txt").write_text("not the repository's")
    link = add_version(root, "encoder", 2) / "model.onnx"
    link.unlink()
    link.symlink_to(tmp_path / "secret.txt")
    with pytest.raises(ModelLoadFailed) as e:
        control.load("encoder")
    reason = "encoder/2/model.onnx links outside the repository, which alone is read"
    assert str(e.value) == f"failed to load model 'encoder': {reason}"
    assert _serving(control, "encoder") == [1] and _states(control, "encoder")[1] == ("2", "UNAVAILABLE", reason)


@pytest.mark.parametrize("mode", ["explicit", "poll"])
def test_a_changed_model_json_reloads_the_serving_version_with_it(root: Path, mode: str) -> None:
    """Its dynamic batching is built into a version, and the config reports its version_policy: both follow
    the file, as Triton reloads a model whose configuration changed (the load answered `loaded: []` before)."""
    control = _control(root, model_control=mode)
    control.load("encoder")
    before = control.runtime.get("encoder")
    assert isinstance(before, EncoderModel) and before.batching["max_batch_size"] == 8
    policy = {"version_policy": {"latest": {"num_versions": 2}}, "dynamic_batching": {"max_batch_size": 1}}
    (root / "encoder/model.json").write_text(json.dumps(policy))
    if mode == "explicit":
        assert [m.version for m in control.load("encoder")] == ["1"]
    else:
        control.poll()
    after = control.runtime.get("encoder")
    assert isinstance(after, EncoderModel) and after is not before and after.batcher is None
    assert after.batching["max_batch_size"] == 1 and after.version_policy == policy["version_policy"]
