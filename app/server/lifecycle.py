"""The repository's lifecycle in one worker: start, settle, loads and unloads, the index.

`start()` is verify sha256 -> build sessions -> parity warm-up -> ready, used by the app's lifespan; `normserve
validate` runs its `build_startup` and `warm_up` steps one by one, with progress. The repository API's loads and
unloads queue on the worker's control thread (app/server/operations.py), go through every worker of the server
in explicit mode (app/server/modelsync.py), and end by settling: a start that left models failing makes the
worker ready once they serve. Inference, metadata and statistics are the data plane's (app/server/dataplane.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.core.model import Model
from app.core.repository import LegacyLayout
from app.core.runtime import Runtime
from app.core.versionstate import IndexRow
from app.server.admission import Admission
from app.server.control import LOAD_ERRORS, ModelControl
from app.server.modelsync import ModelSync
from app.server.operations import Operations
from app.settings import Settings

log = logging.getLogger("normserve")


class Lifecycle:
    """Which models one worker serves, and when it is ready: the repository routes' and the lifespan's face."""

    def __init__(self, settings: Settings, admission: Admission, runtime: Runtime) -> None:
        self.settings = settings
        self.admission = admission
        self.runtime = runtime
        self.control = ModelControl(runtime)
        self.sync: ModelSync | None = None  # explicit mode with several workers: `share` sets it
        self.operations = Operations(settings.model_control_wait_s)  # the repository API's loads and unloads
        self.failed_at_start: dict[str, str] = {}  # model name: why it failed at start (readiness waits on them)

    # ---- start: verify sha256 -> sessions -> parity warm-up -> ready ------------------------------------------

    def build_startup(self) -> list[Model]:
        """sha256 checks and sessions of every model loaded at start (ModelLoadError names the file)."""
        return [m for name in self.control.startup_names() for m in self.control.build(name)]

    def warm_up(self, models: list[Model]) -> dict[tuple[str, str], tuple[float, float]]:
        """The parity warm-up of each model against the NumPy reference, then it serves: (max abs diff,
        tolerance) by (name, version). ModelLoadError past a tolerance."""
        self.admission.not_ready_reason = "parity warm-up running"
        return self.runtime.put_in_service(models)

    def start(self) -> None:
        """Load, warm up, then ready; a failure leaves the worker live but not ready, with the reason.

        Triton's strict readiness: every model meant to be served at start must load. Those that did serve
        meanwhile, and readiness names each one that failed and why."""
        if self.settings.model_control == "explicit" and not self.settings.admin_token:
            log.warning(
                "NORMSERVE_MODEL_CONTROL is explicit but NORMSERVE_ADMIN_TOKEN is not set: the repository API "
                "(load, unload) and the trace and logging routes are closed until a token is set"
            )
        try:
            names = self.control.startup_names()
        except (*LOAD_ERRORS, LegacyLayout) as e:
            self._not_ready(str(e))  # the repository itself: the operator needs its path
            if self.sync is not None:
                self.sync.started(failed=True)
            return
        self.admission.not_ready_reason = "parity warm-up running"
        # A worker started after loads and unloads (uvicorn replaced one) serves what the others serve.
        figures, failures = self.control.start(names, None if self.sync is None else self.sync.published())
        if self.sync is not None:  # what the other workers loaded and unloaded since they started
            self.sync.started()
        if failures:
            self.failed_at_start = failures
            self._not_ready("; ".join(failures.values()))
            self.admission.started = True  # the models that loaded take requests
            return
        diffs = {f"{name}/{version}": diff for (name, version), (diff, _) in figures.items()}
        log.info(
            "ready: parity warm-up max abs diff %s",
            {k: f"{v:.2e}" for k, v in diffs.items()},
            extra={"parity_max_abs_diff": diffs},
        )
        self.admission.ready = True

    def settle(self) -> None:
        """After a load (poll, the repository API): a worker whose start left models failing becomes ready once
        each of them serves or has left the repository, as Triton's strict readiness does; until then readiness
        names those still failing."""
        if not self.admission.started or self.admission.ready:
            return
        on_disk = set(self.control.repository.names())
        failing = {n: r for n, r in self.failed_at_start.items() if n not in self.runtime.serving and n in on_disk}
        if failing:
            self.admission.not_ready_reason = f"model check failed: {'; '.join(failing.values())}"
            return
        log.info("ready: every model that failed at start now serves")
        self.admission.ready = True

    # ---- the server's workers and modes: set up by the app's lifespan -----------------------------------------

    def share(self, folder: Path) -> ModelSync:
        """Explicit mode with several workers: loads and unloads reach every worker through `folder`."""
        self.sync = ModelSync(self.control, folder, lambda: self.admission.draining)
        return self.sync

    def leave(self) -> None:
        """On shutdown: no operation of the server waits for this worker any more."""
        if self.sync is not None:
            self.sync.leave()

    def poll(self) -> None:
        """poll mode's rescan: load what changed or appeared, unload what disappeared, then settle."""
        self.control.poll()
        self.settle()

    # ---- the repository API: index, load, unload (explicit mode) ----------------------------------------------

    def index(self) -> list[IndexRow]:
        """Every version in the repository folder with its state and reason."""
        return self.runtime.index()

    def serves(self, name: str) -> bool:
        """Whether any version of the model serves."""
        return name in self.runtime.serving

    def serving_versions(self, name: str) -> list[int]:
        """The versions of the model that serve, lowest first."""
        return sorted(self.runtime.serving.get(name, {}))

    def check_explicit(self, action: str, name: str) -> None:
        """Loads and unloads through the repository API only in explicit mode: 403 naming the setting."""
        self.control.check_explicit(action, name)

    async def load(self, name: str) -> list[Model]:
        """A load through the repository API, queued behind the worker's other loads and unloads."""
        return await self.operations.run("load", lambda deadline: self._load(name, deadline))

    async def unload(self, name: str) -> list[int]:
        """An unload through the repository API, queued behind the worker's other loads and unloads."""
        return await self.operations.run("unload", lambda deadline: self._unload(name, deadline))

    def _load(self, name: str, deadline: float | None) -> list[Model]:
        """A load, on the control thread; with several workers, applied by every one before it returns (503
        if the server-wide lock is not free by the deadline)."""
        if self.sync is None:
            models = self.control.load(name)
        else:
            models = self.sync.run(lambda: self.control.load(name), name, "load", deadline)
        self.settle()
        return models

    def _unload(self, name: str, deadline: float | None) -> list[int]:
        """An unload, on the control thread; with several workers, applied by every one before it returns."""
        if self.sync is None:
            return self.control.unload(name)
        return self.sync.run(lambda: self.control.unload(name), name, "unload", deadline)

    def _not_ready(self, reason: str) -> None:
        self.admission.not_ready_reason = f"model check failed: {reason}"
        self.runtime.abandon(f"not loaded: {self.admission.not_ready_reason}")
        log.error("not ready: %s", reason, extra={"reason": self.admission.not_ready_reason})
