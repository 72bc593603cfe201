"""onnxruntime sessions: read the manifest, verify each file's sha256, build one session per model."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson

from app.core.batching import Batcher
from app.core.reference import EncoderConfig
from app.errors import ModelNotFound
from app.server import metrics, observability
from app.settings import Settings

log = logging.getLogger("normserve.runtime")

MANIFEST = "manifest.json"


class ModelLoadError(RuntimeError):
    """A model file that is missing, does not match its sha256, or fails its parity warm-up."""


@dataclass
class Model:
    """One loaded model: its session, what the manifest says of it, and for encoders the NumPy weights."""

    name: str
    version: str
    kind: str  # "layernorm" or "encoder"
    path: Path
    sha256: str
    session: ort.InferenceSession
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    parity: dict[str, Any]
    config: EncoderConfig | None = None
    weights: dict[str, np.ndarray] | None = None
    layer_norms: list[str] = field(default_factory=list)
    load_seconds: float = 0.0
    batcher: Batcher | None = None  # encoders, when NORMSERVE_BATCH_MAX_SIZE > 1 (app/batching.py)

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "sha256": self.sha256}

    def run(self, feeds: Mapping[str, np.ndarray], outputs: list[str] | None = None) -> list[np.ndarray]:
        """One inference; onnxruntime's run is thread-safe, so one session serves every thread."""
        start = time.perf_counter()
        result: list[np.ndarray] = self.session.run(outputs, dict(feeds))
        metrics.observe_inference(self.name, time.perf_counter() - start, len(feeds["input"]))
        return result


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def session_options(settings: Settings) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = settings.intra_op_threads
    opts.inter_op_num_threads = 1  # one graph at a time per request; parallelism comes from requests
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    return opts


class Runtime:
    """The loaded models of one worker, built once at start-up."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.models: dict[str, Model] = {}
        self.ready = False
        self.error: str | None = None
        # Requests in flight in this worker (set by create_app): lets a batch stop waiting when nobody else comes.
        self.in_flight: Callable[[], int] | None = None

    def load(self) -> None:
        """Verify every file against the manifest and build its session; ModelLoadError names the file."""
        model_dir = self.settings.model_dir
        manifest_path = model_dir / MANIFEST
        if not manifest_path.is_file():
            raise ModelLoadError(f"{manifest_path}: manifest missing; run `normserve export`")
        manifest = orjson.loads(manifest_path.read_bytes())
        opts = session_options(self.settings)
        for name, entry in sorted(manifest["models"].items()):
            start = time.perf_counter()
            path = model_dir / entry["file"]
            _verify(path, entry["sha256"])
            session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
            model = Model(
                name=name,
                version=str(entry.get("version", "1")),
                kind=entry["kind"],
                path=path,
                sha256=entry["sha256"],
                session=session,
                inputs=entry["inputs"],
                outputs=entry["outputs"],
                parity=entry.get("parity", {}),
            )
            if entry["kind"] == "encoder":
                model.config = EncoderConfig(**entry["config"])
                model.layer_norms = list(entry["layer_norms"])
                model.weights = _load_weights(model_dir / entry["weights"]["file"], entry["weights"]["sha256"])
                if self.settings.batch_max_size > 1:
                    s = self.settings
                    model.batcher = Batcher(
                        model.run, s.batch_max_size, s.batch_delay_us, self.in_flight, name, s.batch_max_seq_len
                    )
            model.load_seconds = time.perf_counter() - start
            self.models[name] = model
            log.info(
                "loaded model %s (%s, sha256 %s...) in %.3f s",
                *(name, path.name, model.sha256[:12], model.load_seconds),
                extra={"model": name, "sha256": model.sha256, "load_seconds": round(model.load_seconds, 4)},
            )

    def get(self, name: str, version: str | None = None) -> Model:
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound(
                f"unknown model {name!r}; available: {', '.join(sorted(self.models)) or 'none'}", "model"
            )
        if version is not None and version != model.version:
            raise ModelNotFound(f"model {name!r} has no version {version!r}; available: {model.version}", "version")
        observability.note_model(name)  # the request's log line names the model it used
        return model


def _verify(path: Path, expected: str) -> None:
    if not path.is_file():
        raise ModelLoadError(f"{path}: model file missing")
    actual = sha256_of(path)
    if actual != expected:
        raise ModelLoadError(f"{path}: sha256 {actual} does not match the manifest's {expected}")


def _load_weights(path: Path, expected: str) -> dict[str, np.ndarray]:
    _verify(path, expected)
    with np.load(path, allow_pickle=False) as npz:  # no pickle: weights are plain arrays
        return {k: npz[k].astype(np.float64) for k in npz.files}
