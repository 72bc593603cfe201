"""Model control, as Triton's: which versions of which models a worker serves, changed without a restart.

`none` loads every model of the repository at start; `explicit` loads NORMSERVE_STARTUP_MODELS at
start and then what the repository API asks (load, unload); `poll` loads everything at start and
then follows the folder, every NORMSERVE_POLL_INTERVAL_S. In every mode a load builds and warms up
each version its version_policy selects before it takes traffic, and retires the versions the
policy no longer selects only once the new ones serve; a failed load changes nothing that serves.
This module decides what to load; the Runtime loads it and alone writes each version's state.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from pathlib import Path

from app.core.model import Model, ModelLoadError
from app.core.repository import LegacyLayout, Policy, PolicyError, Repository
from app.core.runtime import Runtime, VersionEvents
from app.errors import ModelControlDisabled, ModelLoadFailed, ModelNotFound
from app.server.telemetry import metrics

log = logging.getLogger("normserve.models")
# RuntimeError: ModelLoadError, which the runtime raises for anything a version's files break, and a
# RecursionError from a model.json nested too deeply.
LOAD_ERRORS = (RuntimeError, PolicyError, OSError, ValueError, KeyError, TypeError)
Stamp = tuple[tuple[str, int, int], ...]  # (file, size, mtime_ns) of every file of a model's folder


def stamp(folder: Path) -> Stamp:
    """What poll compares between scans: a file written, replaced or removed changes it."""
    files = []
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            st = path.stat()
            files.append((str(path.relative_to(folder)), st.st_size, st.st_mtime_ns))
    return tuple(files)


class Journal(VersionEvents):
    """Each version's load, failure and unload in the metrics and the log."""

    def loaded(self, model: Model, diff: float, atol: float) -> None:
        metrics.record_model(model.name, model.version, model.load_seconds, diff, atol)
        log.info(
            "loaded model %s version %s (sha256 %s...) in %.3f s; parity warm-up max abs diff %.2e",
            *(model.name, model.version, model.sha256[:12], model.load_seconds, diff),
            extra={
                "model": model.name,
                "version": model.version,
                "sha256": model.sha256,
                "load_seconds": round(model.load_seconds, 4),
                "parity_max_abs_diff": diff,
            },
        )

    def failed(self, name: str, version: int, reason: str) -> None:
        metrics.record_load_failure(name, str(version))
        log.error(
            "model %s version %s failed to load: %s", name, version, reason, extra={"model": name, "version": version}
        )

    def unloaded(self, name: str, version: int, reason: str) -> None:
        metrics.record_unload(name, str(version))
        log.info("unloaded model %s version %s: %s", name, version, reason, extra={"model": name})


class ModelControl:
    """Loads, unloads and polls one worker's models: which versions, when; the Runtime loads them and holds their
    state."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.runtime.events = Journal()  # the metrics and the log of a server: a runtime alone has neither
        self.repository: Repository = runtime.repository
        self._stamps: dict[str, Stamp] = {}  # what each model's folder was when it was last loaded or tried

    def check_explicit(self, action: str, name: str) -> None:
        """Loads and unloads through the repository API only in explicit mode: 403 naming the setting."""
        mode = self.runtime.settings.model_control
        if mode != "explicit":
            raise ModelControlDisabled(
                f"cannot {action} model {name!r}: NORMSERVE_MODEL_CONTROL is {mode!r}; the repository API loads "
                "and unloads models only with NORMSERVE_MODEL_CONTROL=explicit"
            )

    def startup_names(self) -> list[str]:
        """The models loaded at start: all of them, or in explicit mode NORMSERVE_STARTUP_MODELS."""
        settings = self.runtime.settings
        self.repository.check_layout()
        names = self.repository.names()
        if settings.model_control == "none" and not names:  # nothing would ever load: not ready, and why
            raise ModelLoadError(f"{self.repository.root}: the repository holds no models; run `normserve export`")
        if settings.model_control != "explicit" or settings.startup_models.strip() == "*":
            return names
        wanted = [n.strip() for n in settings.startup_models.split(",") if n.strip()]
        if missing := [n for n in wanted if n not in names]:
            raise ModelLoadError(f"NORMSERVE_STARTUP_MODELS names {', '.join(missing)}: not in the repository")
        return wanted

    def build(self, name: str, reload: Collection[int] = ()) -> list[Model]:
        """Every version of a model that its policy selects and that does not serve yet (or is to be reloaded),
        built, not warmed up."""
        return self._build(name, *self._plan(name), reload)

    def _plan(self, name: str) -> tuple[Policy, list[int]]:
        """The model's policy and the versions it selects, highest first; the folder's stamp is taken first, so
        that poll does not retry a model.json it could not read until the folder changes."""
        self._stamps[name] = stamp(self.repository.folder(name))
        policy = self.repository.policy(name)
        selected = policy.select(self.repository.versions(name))
        if not selected:
            raise ModelLoadError(f"{self.repository.folder(name)}: no version that its version_policy selects")
        return policy, selected

    def _build(self, name: str, policy: Policy, selected: list[int], reload: Collection[int]) -> list[Model]:
        """The selected versions not serving, those in `reload`, and those built with another dynamic batching
        in model.json (their batcher is built with it): as Triton reloads a model whose configuration changed."""
        serving = self.runtime.serving.get(name, {})
        stale = {
            v for v, m in serving.items() if m.policy is None or m.policy.dynamic_batching != policy.dynamic_batching
        }
        wanted = [v for v in selected if v not in serving or v in reload or v in stale]
        return self.runtime.build_versions(name, wanted, policy)

    def _adopt(self, name: str, policy: Policy) -> None:
        """After a load: its model.json is every serving version's, whose version_policy (which nothing is built
        from) the config reports."""
        for model in self.runtime.serving.get(name, {}).values():
            model.policy = policy

    def load(self, name: str, reload: Collection[int] = ()) -> list[Model]:
        """Load a model's selected versions, then retire the others. ModelLoadFailed (400) if any fails.

        A version in `reload` is built again though it serves; the new one replaces it once warmed up."""
        with self.runtime.lock:
            try:
                policy, selected = self._plan(name)
                models = self._build(name, policy, selected, reload)
                self.runtime.put_in_service(models)
            except ModelNotFound:
                raise
            except LOAD_ERRORS as e:
                raise ModelLoadFailed(f"failed to load model {name!r}: {self.repository.relative(str(e))}") from None
            for version in sorted(set(self.runtime.serving.get(name, {})) - set(selected)):
                self.runtime.retire(name, version, "not selected by the version_policy any more")
            self._adopt(name, policy)
            return models

    def build_exactly(self, name: str, versions: list[int], policy: Policy | None = None) -> list[Model]:
        """These versions of a model, those not serving yet (or built with another policy), built: what another
        worker of the server loaded, with the model.json it loaded (by default, the one on disk)."""
        return self._build(name, policy or self.repository.policy(name), sorted(versions, reverse=True), ())

    def serve_exactly(self, name: str, versions: list[int], policy: Policy | None = None) -> None:
        """Serve these versions of a model and no other: what another worker of the server loaded (modelsync.py)."""
        with self.runtime.lock:
            try:
                policy = policy or self.repository.policy(name)
                self.runtime.put_in_service(self.build_exactly(name, versions, policy))
            except LOAD_ERRORS as e:
                raise ModelLoadFailed(f"failed to load model {name!r}: {self.repository.relative(str(e))}") from None
            for version in sorted(set(self.runtime.serving.get(name, {})) - set(versions)):
                self.runtime.retire(name, version, "not selected by the version_policy any more")
            self._adopt(name, policy)

    def start(
        self, names: list[str], exactly: Mapping[str, list[int]] | None = None
    ) -> tuple[dict[tuple[str, str], tuple[float, float]], dict[str, str]]:
        """Each start-up model loaded on its own: those that load serve whatever the others do. The warm-up
        figures by (name, version), and by name why each model that failed did (its file, repository-relative).
        With `exactly`, what the server's other workers serve since a load or unload (modelsync.py) instead."""
        figures: dict[tuple[str, str], tuple[float, float]] = {}
        failures = {}
        for name in names if exactly is None else sorted(exactly):
            with self.runtime.lock:
                try:
                    models = self.build(name) if exactly is None else self.build_exactly(name, exactly[name])
                    figures |= self.runtime.put_in_service(models)
                except (*LOAD_ERRORS, ModelNotFound) as e:
                    failures[name] = self.repository.relative(str(e))
        return figures, failures

    def unload(self, name: str) -> list[int]:
        """Retire every version of a model: requests already holding one finish on it. The versions retired."""
        with self.runtime.lock:
            versions = sorted(self.runtime.serving.get(name, {}))
            if not versions:
                self.repository.folder(name)  # 404 for a name the repository does not have
            for version in versions:
                self.runtime.retire(name, version, "unloaded")
            return versions

    def poll(self) -> None:
        """Follow the folder: load what changed or appeared, unload what disappeared; failures are logged."""
        on_disk = set(self.repository.names())
        for name in sorted(set(self.runtime.serving) - on_disk):
            log.info("model %s: folder removed; unloading", name, extra={"model": name})
            self.unload(name)
        for name in set(self._stamps) - on_disk:  # a folder put back as it was is loaded again
            del self._stamps[name]
        for name in sorted(on_disk):
            now = stamp(self.repository.root / name)
            if self._stamps.get(name) == now:
                continue  # unchanged since it was loaded, or since its load failed
            try:
                self._retire_removed(name)
                self.load(name, reload=self._changed_serving(name, now))
            except (ModelLoadFailed, ModelNotFound) as e:
                log.error("poll: %s", e, extra={"model": name})

    def _retire_removed(self, name: str) -> None:
        """Serving versions whose folders are gone, unloaded whatever the load then does: they serve from files
        no longer there, and a version that disappeared is unloaded, as a model whose folder did."""
        with self.runtime.lock:
            present = set(self.repository.versions(name))
            for version in sorted(set(self.runtime.serving.get(name, {})) - present):
                log.info("model %s: version %s folder removed; unloading", name, version, extra={"model": name})
                self.runtime.retire(name, version, "its folder was removed")

    def _changed_serving(self, name: str, now: Stamp) -> list[int]:
        """Serving versions whose files changed in place: reloaded, as Triton's poll mode does."""
        changed = {f[0].split("/")[0] for f in set(self._stamps.get(name, ())) ^ set(now)}
        return [v for v in self.runtime.serving.get(name, {}) if str(v) in changed]


__all__ = ["LegacyLayout", "ModelControl", "stamp"]
