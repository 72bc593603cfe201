"""app/server/lifecycle.py: start (load, warm up, ready), a start that left a model failing settling once it
serves, and the repository API's loads, unloads and index.

The workers here are real: Settings and the repo's exported models (or a copy of them with one thing broken).
What a started worker serves: tests/server/test_dataplane.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import REGISTRY

from app.core.runtime import Runtime
from app.core.versionstate import State
from app.errors import ModelControlDisabled, NotReady
from app.server.worker import Worker
from app.settings import Settings
from tests.live_server import MODELS
from tests.repositories import BROKEN, broken_copy, copy_models, learned_layernorm, not_ready_reason
from tests.server.log_records import captured
from tests.server.test_worker import MODEL_NAMES, started


@pytest.fixture
def lifecycle_log() -> Iterator[list[logging.LogRecord]]:
    """The records of the `normserve` logger (the worker's start-up lines) while the test runs."""
    with captured("normserve") as records:
        yield records


def own_lines(records: list[logging.LogRecord], level: int) -> list[logging.LogRecord]:
    return [r for r in records if r.name == "normserve" and r.levelno == level]


# ---- start: verify sha256 -> sessions -> parity warm-up -> ready ------------------------------------------


def test_start_verifies_warms_up_and_then_makes_the_worker_ready(lifecycle_log: list[logging.LogRecord]) -> None:
    worker = Worker(Settings(model_dir=MODELS))
    assert (worker.admission.ready, worker.admission.not_ready_reason) == (False, "models are loading")
    worker.lifecycle.start()
    assert worker.admission.ready and worker.admission.accepting
    assert [(m.name, m.version) for m in worker.lifecycle.runtime.models] == [(name, "1") for name in MODEL_NAMES]
    assert {name: sorted(versions) for name, versions in worker.lifecycle.runtime.serving.items()} == {
        name: [1] for name in MODEL_NAMES
    }
    (ready,) = own_lines(lifecycle_log, logging.INFO)
    diffs: dict[str, float] = vars(ready)["parity_max_abs_diff"]  # an `extra` field of the record, by name/version
    assert sorted(diffs) == sorted(f"{name}/1" for name in MODEL_NAMES) and all(0 <= d < 1e-4 for d in diffs.values())
    loaded = [r.getMessage() for r in lifecycle_log if r.name == "normserve.models" and r.levelno == logging.INFO]
    assert [m.split(" (sha256")[0] for m in loaded] == [f"loaded model {name} version 1" for name in MODEL_NAMES]
    for model in worker.lifecycle.runtime.models:  # the gauges of /metrics hold what this start measured
        labels = {"model": model.name, "version": model.version}
        assert REGISTRY.get_sample_value("normserve_model_load_seconds", labels) == model.load_seconds > 0
        assert REGISTRY.get_sample_value("normserve_model_parity_max_abs_diff", labels) == diffs[f"{model.name}/1"]
        assert REGISTRY.get_sample_value("normserve_model_ready", labels) == 1.0


@pytest.mark.parametrize("how", BROKEN)
def test_start_with_a_broken_model_dir_leaves_the_worker_live_but_not_ready_with_the_reason(
    tmp_path: Path, lifecycle_log: list[logging.LogRecord], how: str
) -> None:
    models = broken_copy(tmp_path, how)
    reason = not_ready_reason(models, how)
    worker = Worker(Settings(model_dir=models))
    worker.lifecycle.start()  # returns, so the process goes on serving liveness and this reason
    assert (worker.admission.ready, worker.admission.not_ready_reason) == (False, reason)
    (line,) = own_lines(lifecycle_log, logging.ERROR)
    assert line.getMessage() == "not ready: " + reason.removeprefix("model check failed: ")
    assert vars(line)["reason"] == reason
    broken = "encoder" if how == "missing" else "layernorm"
    with pytest.raises(NotReady) as e:
        worker.plane.model(broken)
    assert e.value.message == f"server is not ready: {reason}"
    # Strict readiness, but the models that loaded serve (as Triton's do): no 503 for a request to them.
    assert [m.name for m in worker.lifecycle.runtime.models] == [n for n in MODEL_NAMES if n != broken]
    assert worker.plane.model("encoder-preln").name == "encoder-preln"
    worker.admission.enter()
    worker.admission.leave()


def test_start_with_weights_that_fail_the_parity_warm_up_is_not_ready(tmp_path: Path) -> None:
    models = tmp_path / "models"
    copy_models(models)
    folder = models / "encoder/1"
    manifest = json.loads((folder / "manifest.json").read_text())
    with np.load(folder / "weights.npz") as npz:
        weights = {k: npz[k] for k in npz.files}
    name = next(k for k in sorted(weights) if k.endswith("weight") and weights[k].ndim == 2)
    np.savez(folder / "weights.npz", **{**weights, name: weights[name] * 1.01})  # the reference now differs
    manifest["files"]["weights.npz"] = hashlib.sha256((folder / "weights.npz").read_bytes()).hexdigest()  # sha256 ok
    (folder / "manifest.json").write_text(json.dumps(manifest))
    model = Runtime(Settings(model_dir=models)).build("encoder", 1)  # built: sha256 and session pass
    diff, atol = model.warm_up()  # the same fixed-input warm-up, run here once more
    assert diff > atol
    labels = {"model": "encoder", "version": "1"}
    failures = REGISTRY.get_sample_value("normserve_model_load_failures_total", labels) or 0.0
    worker = Worker(Settings(model_dir=models))
    worker.lifecycle.start()
    assert not worker.admission.ready
    assert worker.admission.not_ready_reason == (
        f"model check failed: encoder/1/model.onnx: parity warm-up failed, max abs diff {diff:.3g} > {atol:.3g}"
    )
    assert [m.name for m in worker.lifecycle.runtime.models] == ["encoder-preln", "layernorm"]  # the others serve
    assert REGISTRY.get_sample_value("normserve_model_load_failures_total", labels) == failures + 1


def test_warm_up_runs_show_in_the_inference_metric_but_are_no_executions_of_the_statistics() -> None:
    def warm_up_runs() -> float:
        labels = {"model": "layernorm", "version": "1"}
        return REGISTRY.get_sample_value("normserve_inference_duration_seconds_count", labels) or 0.0

    before = warm_up_runs()
    worker = started()
    assert warm_up_runs() > before
    stats = worker.statistics.report([(name, "1") for name in MODEL_NAMES])["model_stats"]
    assert [s["execution_count"] for s in stats] == [0, 0, 0]


def test_a_start_that_left_a_model_failing_is_ready_once_that_model_loads(tmp_path: Path) -> None:
    models = broken_copy(tmp_path, "tampered")
    worker = Worker(Settings(model_dir=models, model_control="explicit", admin_token="t"))
    worker.lifecycle.start()
    worker.lifecycle.settle()  # nothing changed: still not ready, for the same reason
    assert (worker.admission.ready, worker.admission.not_ready_reason) == (False, not_ready_reason(models, "tampered"))
    shutil.copy(MODELS / "layernorm/1/model.onnx", models / "layernorm/1/model.onnx")  # the file as exported
    worker.lifecycle.control.load("layernorm")
    worker.lifecycle.settle()
    assert worker.admission.ready and worker.plane.model("layernorm").name == "layernorm"


# ---- the repository API's face: index, load, unload, the explicit check -------------------------------------


def test_load_and_unload_queue_on_the_control_thread_and_change_the_index(tmp_path: Path) -> None:
    models = copy_models(tmp_path / "models", ("layernorm",))
    learned_layernorm(models, "my-ln", 1, np.full(3, 2.0), np.zeros(3))
    worker = Worker(Settings(model_dir=models, model_control="explicit", startup_models="layernorm", admin_token="t"))
    lifecycle = worker.lifecycle
    lifecycle.start()
    assert [tuple(row) for row in lifecycle.index()] == [
        ("layernorm", 1, State.READY, ""),
        ("my-ln", 1, State.UNAVAILABLE, "not loaded"),
    ]
    assert (lifecycle.serves("my-ln"), lifecycle.serving_versions("my-ln")) == (False, [])

    async def scenario() -> tuple[list[str], list[int], list[int]]:
        loaded = [m.version for m in await lifecycle.load("my-ln")]
        serving = lifecycle.serving_versions("my-ln")
        return loaded, serving, await lifecycle.unload("my-ln")

    assert asyncio.run(scenario()) == (["1"], [1], [1])
    assert (lifecycle.serves("my-ln"), lifecycle.serving_versions("my-ln")) == (False, [])
    assert lifecycle.index()[1] == ("my-ln", 1, State.UNAVAILABLE, "unloaded")
    assert worker.plane.model("layernorm").name == "layernorm"  # what did not change serves on


@pytest.mark.parametrize("mode", ["none", "poll"])
@pytest.mark.parametrize("action", ["load", "unload"])
def test_the_repository_api_outside_explicit_mode_is_refused_naming_the_setting(mode: str, action: str) -> None:
    lifecycle = Worker(Settings(model_dir=MODELS, model_control=mode)).lifecycle
    with pytest.raises(ModelControlDisabled) as e:
        lifecycle.check_explicit(action, "layernorm")
    assert e.value.message == (
        f"cannot {action} model 'layernorm': NORMSERVE_MODEL_CONTROL is {mode!r}; the repository API loads "
        "and unloads models only with NORMSERVE_MODEL_CONTROL=explicit"
    )


def test_build_startup_then_warm_up_is_the_start_step_by_step_without_readiness() -> None:
    """What `normserve validate` runs: built and verified first, serving only once warmed up; the worker is not
    made ready (no server)."""
    lifecycle = Worker(Settings(model_dir=MODELS)).lifecycle
    built = lifecycle.build_startup()
    assert [(m.name, m.version) for m in built] == [(name, "1") for name in MODEL_NAMES]
    assert lifecycle.runtime.models == []  # built, not serving
    figures = lifecycle.warm_up(built)
    assert sorted(figures) == [(name, "1") for name in MODEL_NAMES]
    assert all(0 <= diff <= atol for diff, atol in figures.values())
    assert [m.name for m in lifecycle.runtime.models] == MODEL_NAMES
    assert (lifecycle.admission.ready, lifecycle.admission.not_ready_reason) == (False, "parity warm-up running")
