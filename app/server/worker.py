"""One Worker per server process: the objects it builds once.

The protocols' inference, metadata and statistics routes take its data plane (`plane`, app/server/dataplane.py);
the repository's routes and the app's lifespan take its lifecycle (`lifecycle`, app/server/lifecycle.py: start,
settle, loads, unloads, the index). Both share the worker's admission, so readiness is one.
"""

from __future__ import annotations

from app.server.admission import Admission
from app.server.budget import Budget
from app.server.dataplane import DataPlane
from app.server.drain import Drain
from app.server.lifecycle import Lifecycle
from app.server.telemetry.statistics import Statistics
from app.settings import Settings


class Worker:
    """Everything one server process builds once: settings, admission, body budget, statistics, the data plane,
    the repository's lifecycle and the drain."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.admission = Admission(settings.max_in_flight)
        # Request body bytes in flight, every transport; readiness reports it refusing everything.
        self.budget = Budget(settings.max_inflight_bytes, settings.min_body_rate)
        self.admission.saturated = self.budget.refusing
        self.statistics = Statistics()
        self.plane = DataPlane(settings, self.admission, self.statistics)
        self.lifecycle = Lifecycle(settings, self.admission, self.plane.runtime)
        self.drain = Drain(self.admission, settings.drain_timeout_s)
