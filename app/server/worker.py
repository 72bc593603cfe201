"""One Worker per server process: the objects it builds once, and the repository's lifecycle.

`start()` is the lifecycle (verify sha256 -> build sessions -> parity warm-up -> ready), used by the
app's lifespan and by `normserve validate` alike; loads and unloads through the repository API, and a start
that left models failing settling once they serve. Inference, metadata and statistics are the data plane's
(`plane`, app/server/dataplane.py), the one face the protocols' inference and metadata routes take.
"""

from __future__ import annotations

import logging

from app.core.model import Model
from app.core.repository import LegacyLayout
from app.server.admission import Admission
from app.server.budget import Budget
from app.server.control import LOAD_ERRORS, ModelControl
from app.server.dataplane import DataPlane
from app.server.drain import Drain
from app.server.modelsync import ModelSync
from app.server.telemetry.statistics import Statistics
from app.settings import Settings

log = logging.getLogger("normserve")


class Worker:
    """Everything one server process builds once; the repository's routes take it, the others its `plane`.

    `normserve validate` runs the same `load` and `warm_up` steps as `start`, one by one with progress.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.admission = Admission(settings.max_in_flight)
        self.budget = Budget(settings.max_inflight_bytes)  # request body bytes in flight, every transport
        self.statistics = Statistics()
        self.plane = DataPlane(settings, self.admission, self.statistics)
        self.runtime = self.plane.runtime
        self.control = ModelControl(self.runtime)
        self.sync: ModelSync | None = None  # explicit mode with several workers: set by the app's lifespan
        self.drain = Drain(self.admission, settings.drain_timeout_s)
        self.failed_at_start: dict[str, str] = {}  # model name: why it failed at start (readiness waits on them)

    def load(self) -> list[Model]:
        """sha256 checks and sessions of every model loaded at start (ModelLoadError names the file)."""
        return [m for name in self.control.startup_names() for m in self.control.build(name)]

    def warm_up(self, models: list[Model]) -> dict[tuple[str, str], tuple[float, float]]:
        """The parity warm-up of each model against the NumPy reference, then it serves: (max abs diff,
        tolerance) by (name, version). ModelLoadError past a tolerance."""
        self.admission.not_ready_reason = "parity warm-up running"
        return self.runtime.serve(models)

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

    def load_model(self, name: str) -> list[Model]:
        """A load through the repository API; with several workers, applied by every one before it returns."""
        models = self.control.load(name) if self.sync is None else self.sync.run(lambda: self.control.load(name), name)
        self.settle()
        return models

    def unload_model(self, name: str) -> list[int]:
        """An unload through the repository API; with several workers, applied by every one before it returns."""
        if self.sync is None:
            return self.control.unload(name)
        return self.sync.run(lambda: self.control.unload(name), name)

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

    def _not_ready(self, reason: str) -> None:
        self.admission.not_ready_reason = f"model check failed: {reason}"
        self.runtime.abandon(f"not loaded: {self.admission.not_ready_reason}")
        log.error("not ready: %s", reason, extra={"reason": self.admission.not_ready_reason})
