"""The model versions one worker serves: built from the repository, warmed up, published, retired.

A version takes traffic only once it is built (sha256 of every file, one session) and has passed
its parity warm-up against the NumPy reference. Publishing swaps in a new dict of the serving
versions, so a request reads a consistent snapshot without a lock, and one already holding a
model object finishes on it after that version is retired (onnxruntime frees the session when the
last holder lets go). Loads and unloads take one lock: they are rare, inference never waits on it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import onnxruntime as ort

from app.core.encoder import EncoderModel
from app.core.layernorm import LayerNormModel
from app.core.model import Loaded, Model, ModelLoadError, RunObserver, verify
from app.core.repository import MANIFEST, MODEL_FILE, Policy, Repository, check_name, check_version
from app.errors import ModelNotFound
from app.settings import Settings

log = logging.getLogger("normserve.runtime")

KINDS: dict[str, type[Model]] = {cls.kind: cls for cls in (LayerNormModel, EncoderModel)}
READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"  # Triton's states


@dataclass(frozen=True)
class State:
    """A version's state in the repository index, and why it is not READY."""

    state: str
    reason: str = ""


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
    """The serving versions of every model by name, and the state of each version it has tried."""

    def __init__(
        self, settings: Settings, observe: RunObserver = _ignore, in_flight: Callable[[], int] | None = None
    ) -> None:
        self.settings = settings
        self.repository = Repository(settings.model_dir)
        self.serving: dict[str, dict[int, Model]] = {}  # replaced whole, never mutated: readers need no lock
        self.states: dict[tuple[str, int], State] = {}
        self.lock = threading.RLock()  # one load or unload at a time
        self._observe = observe
        self._in_flight = in_flight
        self._opts = session_options(settings)

    @property
    def models(self) -> list[Model]:
        """Every serving version, by name then version."""
        return [m for name in sorted(self.serving) for _, m in sorted(self.serving[name].items())]

    def load(self) -> None:
        """Every model's versions as its policy selects them, built, warmed up and serving: a runtime with no
        server around it (benchmarks, scripts). A server's worker loads through app/server/control.py."""
        self.repository.check_layout()
        for name in self.repository.names():
            policy = self.repository.policy(name)
            for version in policy.select(self.repository.versions(name)):
                model = self.build(name, version, policy)
                self.warm_up(model)
                self.publish(model)

    def build(self, name: str, version: int, policy: Policy | None = None) -> Model:
        """sha256 of every file and the session: ModelLoadError names the file. Not warmed up, not serving."""
        start = time.perf_counter()
        folder = self.repository.version_dir(name, version)
        if not (folder / MANIFEST).is_file():
            raise ModelLoadError(f"{folder / MANIFEST}: manifest missing")
        try:
            manifest = self.repository.manifest(name, version)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{folder}: unreadable manifest ({e})") from None
        kind = KINDS.get(manifest.get("kind", ""))
        if kind is None:
            raise ModelLoadError(f"{folder}: unknown kind {manifest.get('kind')!r}; expected one of {sorted(KINDS)}")
        files = manifest.get("files")
        if not isinstance(files, dict) or MODEL_FILE not in files:
            raise ModelLoadError(f"{folder}: the manifest lists no {MODEL_FILE}")
        for file, sha256 in sorted(files.items()):
            verify(folder / check_name(file, "files"), str(sha256))
        path = folder / MODEL_FILE
        session = ort.InferenceSession(str(path), sess_options=self._opts, providers=["CPUExecutionProvider"])
        policy = policy or self.repository.policy(name)
        entry = {**manifest, "name": name, "version": str(version), "sha256": files[MODEL_FILE]}
        model = kind(Loaded(entry, path, session, self.settings, self._observe, self._in_flight, policy))
        model.load_seconds = time.perf_counter() - start
        return model

    @staticmethod
    def warm_up(model: Model) -> tuple[float, float]:
        """The model on fixed inputs against the NumPy reference: (max abs diff, tolerance); ModelLoadError past it."""
        diff, atol = model.warm_up()
        if not diff <= atol:
            raise ModelLoadError(f"{model.path}: parity warm-up failed, max abs diff {diff:.3g} > {atol:.3g}")
        return diff, atol

    def publish(self, model: Model) -> None:
        """The version takes traffic: requests without a version go to the highest one serving."""
        with self.lock:
            versions = {**self.serving.get(model.name, {}), int(model.version): model}
            self.serving = {**self.serving, model.name: versions}
            self.states[model.name, int(model.version)] = State(READY)

    def retire(self, name: str, version: int, reason: str = "unloaded") -> Model | None:
        """The version takes no new request; those holding it finish on it. The model retired, if it served."""
        with self.lock:
            versions = dict(self.serving.get(name, {}))
            model = versions.pop(version, None)
            serving = {**self.serving, name: versions}
            if not versions:
                del serving[name]
            self.serving = serving
            if model is not None or (name, version) in self.states:
                self.states[name, version] = State(UNAVAILABLE, reason)
        if model is not None:
            model.close()
        return model

    def get(self, name: str, version: str | int | None = None) -> Model:
        """The serving model: the given version, or the highest one; 404 naming what serves."""
        check_name(name)
        versions = self.serving.get(name)
        if not versions:
            available = ", ".join(sorted(self.serving)) or "none"
            raise ModelNotFound(f"unknown model {name!r}; available: {available}", "model")
        if version is None or version == "":
            return versions[max(versions)]
        model = versions.get(check_version(version))
        if model is None:
            ready = ", ".join(str(v) for v in sorted(versions))
            raise ModelNotFound(f"model {name!r} has no ready version {version!r}; ready: {ready}", "version")
        return model
