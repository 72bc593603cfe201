"""The loaded models of one worker: read the manifest, verify each file's sha256, build each kind's session once."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import onnxruntime as ort
import orjson

from app.core.encoder import EncoderModel
from app.core.layernorm import LayerNormModel
from app.core.model import Loaded, Model, ModelLoadError, RunObserver, verify
from app.errors import ModelNotFound
from app.settings import Settings

log = logging.getLogger("normserve.runtime")

MANIFEST = "manifest.json"
KINDS: dict[str, type[Model]] = {cls.kind: cls for cls in (LayerNormModel, EncoderModel)}


def session_options(settings: Settings) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = settings.intra_op_threads
    opts.inter_op_num_threads = 1  # one graph at a time per request; parallelism comes from requests
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    return opts


def _ignore(_model: str, _version: str, _seconds: float, _rows: int) -> None:
    """The observer of a runtime nobody watches (benchmarks, tests)."""


class Runtime:
    """Every model of one worker by name, each built once at start-up by its kind's class."""

    def __init__(
        self, settings: Settings, observe: RunObserver = _ignore, in_flight: Callable[[], int] | None = None
    ) -> None:
        self.settings = settings
        self.models: dict[str, Model] = {}
        self._observe = observe
        self._in_flight = in_flight

    def load(self) -> None:
        """Verify every file against the manifest and build its model; ModelLoadError names the file."""
        manifest_path = self.settings.model_dir / MANIFEST
        if not manifest_path.is_file():
            raise ModelLoadError(f"{manifest_path}: manifest missing; run `normserve export`")
        manifest = orjson.loads(manifest_path.read_bytes())
        opts = session_options(self.settings)
        for name, entry in sorted(manifest["models"].items()):
            start = time.perf_counter()
            model = self._build({"name": name, **entry}, opts)
            model.load_seconds = time.perf_counter() - start
            self.models[name] = model
            log.info(
                "loaded model %s (%s, sha256 %s...) in %.3f s",
                *(name, model.path.name, model.info.sha256[:12], model.load_seconds),
                extra={"model": name, "sha256": model.info.sha256, "load_seconds": round(model.load_seconds, 4)},
            )

    def _build(self, entry: dict[str, Any], opts: ort.SessionOptions) -> Model:
        kind = KINDS.get(entry["kind"])
        if kind is None:
            raise ModelLoadError(f"{entry['name']}: unknown kind {entry['kind']!r}; expected one of {sorted(KINDS)}")
        path = self.settings.model_dir / entry["file"]
        verify(path, entry["sha256"])
        session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        return kind(Loaded(entry, path, session, self.settings, self._observe, self._in_flight))

    def get(self, name: str, version: str | None = None) -> Model:
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound(
                f"unknown model {name!r}; available: {', '.join(sorted(self.models)) or 'none'}", "model"
            )
        if version is not None and version != model.version:
            raise ModelNotFound(f"model {name!r} has no version {version!r}; available: {model.version}", "version")
        return model

    def warm_up(self) -> dict[str, tuple[float, float]]:
        """Every model on fixed inputs against the NumPy reference: (max abs diff, tolerance) by name.

        ModelLoadError at the first model past its tolerance."""
        figures: dict[str, tuple[float, float]] = {}
        for name, model in self.models.items():
            diff, atol = model.warm_up()
            if not diff <= atol:
                raise ModelLoadError(f"{model.path}: parity warm-up failed, max abs diff {diff:.3g} > {atol:.3g}")
            figures[name] = diff, atol
        return figures
