"""app/server/worker.py: what one process builds once, and the one readiness its data plane and its lifecycle share.

The workers here are real: Settings and the repo's exported models. The lifecycle itself (start, loads, unloads):
tests/server/test_lifecycle.py; what a started worker serves: tests/server/test_dataplane.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.errors import BudgetExhausted, NotReady
from app.server.worker import Worker
from app.settings import Settings
from tests.live_server import MODELS

MODEL_NAMES = ["encoder", "encoder-preln", "layernorm"]
WAIT_S = 10.0  # the longest a blocked job or a wait here lasts, so that a failing test never hangs


def started(**settings: Any) -> Worker:
    """A worker on the repo's models, started as the app's lifespan starts it."""
    worker = Worker(Settings(model_dir=MODELS, **settings))
    worker.lifecycle.start()
    assert worker.admission.ready, worker.admission.not_ready_reason
    return worker


def test_what_the_lifecycle_starts_is_what_the_data_plane_serves() -> None:
    worker = Worker(Settings(model_dir=MODELS))
    with pytest.raises(NotReady) as e:  # one readiness: the plane refuses until the lifecycle has started
        worker.plane.model("layernorm")
    assert e.value.message == "server is not ready: models are loading"
    worker.lifecycle.start()
    assert worker.admission.ready and worker.admission.accepting
    for name in MODEL_NAMES:
        assert worker.plane.model(name) is worker.lifecycle.runtime.serving[name][1]
    assert [m["name"] for m in worker.plane.statistics()["model_stats"]] == MODEL_NAMES


@pytest.mark.parametrize("refused", [False, True], ids=["full", "full-and-refused"])
def test_the_body_budget_refusing_everything_makes_the_started_worker_not_accepting(refused: bool) -> None:
    """The budget is the worker's, every transport's: readiness reports it refusing everything."""
    worker = started(max_inflight_bytes=1024)

    async def fill() -> None:
        await worker.budget.take(1024)
        if refused:
            with pytest.raises(BudgetExhausted):
                await worker.budget.take(512, wait_s=0)

    asyncio.run(fill())
    assert (worker.budget.refusing(), worker.admission.accepting) == (refused, not refused)
