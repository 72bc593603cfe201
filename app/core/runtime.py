"""The model versions one worker serves: built from the repository, warmed up, published, retired.

A version takes traffic once built (sha256 of every file, one session) and past its parity warm-up against the
NumPy reference. Publishing swaps in a new dict of the serving versions: a request reads a consistent snapshot
without a lock, and one holding a model object finishes on it after its version is retired or reloaded, which
closes it (onnxruntime frees the session when the last holder lets go). Loads and unloads take one lock.

The Runtime alone writes each version's State: a load is `build_versions` (LOADING) then `put_in_service`
(READY), a failure in it changes nothing that serves (`fail`), `retire` shows UNLOADING until the version is closed.
What to load is the caller's: `load` alone, app/server/control.py in a server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import onnxruntime as ort

from app.core import heap
from app.core.encoder import EncoderModel
from app.core.layernorm import LayerNormModel
from app.core.model import Loaded, Model, ModelLoadError, RunObserver, check_graph, describe, verify, version_sha256
from app.core.repository import MANIFEST, MODEL_FILE, Policy, Repository, check_name, check_version
from app.core.textbatching import PooledTextEncoder
from app.core.versionstate import IndexRow, State, VersionState
from app.errors import ModelNotFound
from app.settings import Settings

KINDS: dict[str, type[Model]] = {cls.kind: cls for cls in (LayerNormModel, EncoderModel, PooledTextEncoder)}


class VersionEvents:
    """What a server records of each version's change (metrics, logs: app/server/control.py); alone, nothing."""

    def loaded(self, model: Model, diff: float, atol: float) -> None:
        """The version serves, its warm-up passed with this max abs diff under this tolerance."""

    def failed(self, name: str, version: int, reason: str) -> None:
        """The version failed to load, for this reason (its file, repository-relative)."""

    def unloaded(self, name: str, version: int, reason: str) -> None:
        """The version served and was retired."""


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
        self._states: dict[tuple[str, int], VersionState] = {}
        self.lock = threading.RLock()  # one load or unload at a time
        self.events = VersionEvents()  # a server's model control records the changes (control.py)
        self._observe = observe
        self._in_flight = in_flight
        self._opts = session_options(settings)

    @property
    def models(self) -> list[Model]:
        """Every serving version, by name then version."""
        return [m for name in sorted(self.serving) for _, m in sorted(self.serving[name].items())]

    @property
    def states(self) -> Mapping[tuple[str, int], VersionState]:
        """The state of each version tried, by (name, version); read-only: only the Runtime's methods change it."""
        return MappingProxyType(self._states)

    def load(self) -> None:
        """Every model's versions its policy selects, serving; without a server (a worker's: app/server/control.py)."""
        self.repository.check_layout()
        for name in self.repository.names():
            policy = self.repository.policy(name)
            self.put_in_service(self.build_versions(name, policy.select(self.repository.versions(name)), policy))

    def build_versions(self, name: str, versions: list[int], policy: Policy) -> list[Model]:
        """These versions of a model, each LOADING then built, not warmed up; if one fails, none will serve."""
        built: list[Model] = []
        for version in versions:
            self._states[name, version] = VersionState(State.LOADING)
            try:
                built.append(self.build(name, version, policy))
            except Exception as e:
                self.fail(name, version, e, built)
                raise
        return built

    def put_in_service(self, models: list[Model]) -> dict[tuple[str, str], tuple[float, float]]:
        """Each version's parity warm-up; only once all passed, they serve together. (diff, atol) by (name, version)."""
        figures = {}
        for model in models:
            try:
                figures[model.name, model.version] = self.warm_up(model)
            except Exception as e:
                self.fail(model.name, int(model.version), e, models)
                raise
        heap.trim()  # what the warm-ups freed goes back to the OS, not into the idle worker's RSS (heap.py)
        for model in models:
            self.publish(model)
            self.events.loaded(model, *figures[model.name, model.version])
        return figures

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
            verify(self.repository.inside(folder / check_name(file, "files"), ModelLoadError), str(sha256))
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
        """The version takes traffic (requests without a version go to the highest); the model it replaces closes."""
        with self.lock:
            versions = self.serving.get(model.name, {})
            replaced = versions.get(int(model.version))
            self.serving = {**self.serving, model.name: {**versions, int(model.version): model}}
            self._states[model.name, int(model.version)] = VersionState(State.READY)
        if replaced is not None:
            replaced.close()  # a reload in place: its batcher's thread kept the old session alive; holders finish

    def retire(self, name: str, version: int, reason: str = "unloaded") -> Model | None:
        """The version takes no new request (UNLOADING until closed), its holders finish on it: the model, if any."""
        with self.lock:
            versions = dict(self.serving.get(name, {}))
            model = versions.pop(version, None)
            serving = {**self.serving, name: versions}
            if not versions:
                del serving[name]
            self.serving = serving
            if model is not None:
                self._states[name, version] = VersionState(State.UNLOADING)
            elif (name, version) in self._states:
                self._states[name, version] = VersionState(State.UNAVAILABLE, reason)
        if model is not None:
            model.close()
            self._states[name, version] = VersionState(State.UNAVAILABLE, reason)
            self.events.unloaded(name, version, reason)
        return model

    def fail(self, name: str, version: int, error: Exception, built: list[Model]) -> None:
        """A version failed to load: its state says why (its file, repository-relative); the versions loaded with
        it do not serve either (they change together), and none built for this load will: their batchers stop."""
        for model in built:
            model.close()
            if model.version != str(version) and int(model.version) not in self.serving.get(name, {}):
                self._states[name, int(model.version)] = VersionState(State.UNAVAILABLE, f"version {version} failed")
        reason = self.repository.relative(str(error))
        if version in self.serving.get(name, {}):  # a reload: the version loaded before goes on serving
            self._states[name, version] = VersionState(
                State.READY, f"reload failed; the previous files serve: {reason}"
            )
        else:
            self._states[name, version] = VersionState(State.UNAVAILABLE, reason)
        self.events.failed(name, version, reason)

    def abandon(self, reason: str) -> None:
        """Versions left LOADING by a start-up that failed elsewhere: they never serve, and the index says why."""
        for key, state in list(self._states.items()):
            if state.state is State.LOADING:
                self._states[key] = VersionState(State.UNAVAILABLE, reason)

    def adopt(self, states: Mapping[tuple[str, int], VersionState]) -> None:
        """The states another worker of the server holds, once this one serves what it serves (modelsync.py)."""
        self._states.update(states)

    def index(self) -> list[IndexRow]:
        """Every version in the folder and every serving one, with its state: Triton's repository index."""
        rows = []
        for name in sorted(set(self.serving) | set(self.repository.names())):
            try:
                versions = set(self.repository.versions(name))
            except (ModelNotFound, OSError):
                versions = set()
            for version in sorted(versions | set(self.serving.get(name, {}))):
                state = self._states.get((name, version), VersionState(State.UNAVAILABLE, "not loaded"))
                rows.append(IndexRow(name, version, state.state, state.reason))
        return rows

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
