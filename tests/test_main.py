"""app/main.py: the module-level app that `uvicorn app.main:app` serves, built by create_app from the environment."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest
from fastapi import FastAPI

import app.main
import app.server.app
from app.server.worker import Worker
from app.settings import Settings


def _fresh_main() -> ModuleType:
    """app/main.py executed once more as a module of its own, so that it reads the environment now."""
    assert app.main.__file__ is not None
    spec = importlib.util.spec_from_file_location("normserve_main_copy", app.main.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _routes(application: FastAPI) -> dict[str, list[str]]:
    """{path: methods} of every documented route."""
    return {path: sorted(ops) for path, ops in application.openapi()["paths"].items()}


def test_main_exports_a_fastapi_app_and_the_factory_that_built_it() -> None:
    assert app.main.__all__ == ["app", "create_app"]
    assert isinstance(app.main.app, FastAPI)
    assert app.main.create_app is app.server.app.create_app
    assert isinstance(app.main.app.state.worker, Worker)


def test_main_app_has_the_routes_of_create_app() -> None:
    routes = _routes(app.main.app)
    assert routes == _routes(app.server.app.create_app(Settings()))
    assert routes["/normalize"] == ["post"] and routes["/v2/models/{name}/infer"] == ["post"]


def test_main_app_reads_its_settings_from_the_environment_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("NORMSERVE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NORMSERVE_MODEL_DIR", "/srv/normserve-models")
    monkeypatch.setenv("NORMSERVE_MAX_IN_FLIGHT", "3")
    settings = _fresh_main().app.state.worker.settings
    assert settings == Settings(model_dir=Path("/srv/normserve-models"), max_in_flight=3)


def test_importing_main_does_not_load_the_models(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NORMSERVE_MODEL_DIR", str(tmp_path / "nothing-here"))
    worker = _fresh_main().app.state.worker  # no manifest there: loading happens in the lifespan, not on import
    assert worker.plane.runtime.models == []
    assert not worker.admission.ready
