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
from pathlib import Path
from typing import Any

import onnxruntime as ort

from app.core.encoder import EncoderModel
from app.core.layernorm import LayerNormModel
from app.core.model import Loaded, Model, ModelLoadError, RunObserver, check_graph, describe, verify, version_sha256
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


def _ignore(_model: str, _version: str, _seconds: float, _rows: int, _warm_up: bool) -> None:
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
        """sha256 of every file, the session, the manifest checked against it: ModelLoadError names the file and
        says why, whatever broke (a file can be anything). Not warmed up, not serving."""
        start = time.perf_counter()
        folder = self.repository.version_dir(name, version)
        try:
            model = self._build(name, version, folder, policy)
        except ModelLoadError:
            raise
        except Exception as e:  # a kind's constructor reading a manifest or weights that are not what it expects
            raise ModelLoadError(f"{folder / MANIFEST}: {describe(e)}") from e
        model.load_seconds = time.perf_counter() - start
        return model

    def _build(self, name: str, version: int, folder: Path, policy: Policy | None) -> Model:
        manifest = self._manifest(name, version, folder)
        kind = KINDS.get(manifest.get("kind", ""))
        if kind is None:
            raise ModelLoadError(f"{folder}: unknown kind {manifest.get('kind')!r}; expected one of {sorted(KINDS)}")
        files = manifest.get("files")
        if not isinstance(files, dict) or MODEL_FILE not in files:
            raise ModelLoadError(f"{folder}: the manifest lists no {MODEL_FILE}")
        for file, sha256 in sorted(files.items()):
            verify(folder / check_name(file, "files"), str(sha256))
        path = folder / MODEL_FILE
        session = self._session(path)
        policy = policy or self.repository.policy(name)
        entry = {**manifest, "name": name, "version": str(version), "sha256": version_sha256(files)}
        model = kind(Loaded(entry, path, session, self.settings, self._observe, self._in_flight, policy))
        try:
            check_graph(model, manifest, folder / MANIFEST)
        except ModelLoadError:
            model.close()  # its batcher's thread: the version never serves
            raise
        return model

    def _manifest(self, name: str, version: int, folder: Path) -> dict[str, Any]:
        if not (folder / MANIFEST).is_file():
            raise ModelLoadError(f"{folder / MANIFEST}: manifest missing")
        try:
            return self.repository.manifest(name, version)
        except (OSError, ValueError, RecursionError) as e:
            reason = describe(e) if isinstance(e, RecursionError) else str(e)
            raise ModelLoadError(f"{folder}: unreadable manifest ({reason})") from None

    def _session(self, path: Path) -> ort.InferenceSession:
        try:
            return ort.InferenceSession(str(path), sess_options=self._opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime's own classes (InvalidProtobuf, Fail, ...) derive from Exception only
            text = str(e)
            detail = text.split(" failed:", 1)[1] if " failed:" in text else text
            raise ModelLoadError(f"{path}: onnxruntime cannot load it: {detail.strip()}") from None

    @staticmethod
    def warm_up(model: Model) -> tuple[float, float]:
        """The model on fixed inputs against the NumPy reference: (max abs diff, tolerance); ModelLoadError past it."""
        model.warming = True  # its runs are told to the observer as the warm-up's, whether at start or on a load
        try:
            diff, atol = model.warm_up()
        except ModelLoadError:
            raise
        except Exception as e:  # the graph or the weights fail on the warm-up's inputs: they would on a request's
            raise ModelLoadError(f"{model.path}: parity warm-up failed: {describe(e)}") from e
        finally:
            model.warming = False
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
