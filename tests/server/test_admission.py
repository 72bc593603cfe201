"""app/server/admission.py: readiness, draining and the in-flight limit, refusals naming their reason in full; the
connection limit within the process's descriptors."""

from __future__ import annotations

import resource
import threading
import time

import anyio
import pytest
from prometheus_client import REGISTRY

from app.errors import NotReady, Overloaded
from app.server.admission import FD_RESERVE, Admission, connection_limit
from app.settings import Settings


def ready(max_in_flight: int = 2) -> Admission:
    admission = Admission(max_in_flight)
    admission.ready = True
    return admission


def test_a_new_admission_is_not_ready_because_models_are_loading() -> None:
    admission = Admission(4)
    assert (admission.ready, admission.draining, admission.count()) == (False, False, 0)
    with pytest.raises(NotReady) as e:
        admission.enter()
    assert e.value.message == "server is not ready: models are loading"
    assert admission.count() == 0


@pytest.mark.parametrize(
    ("ready_", "draining", "gauge"), [(False, False, 0), (True, False, 1), (True, True, 0), (False, True, 0)]
)
def test_the_readiness_gauge_follows_ready_and_a_published_drain(ready_: bool, draining: bool, gauge: int) -> None:
    admission = Admission(3)
    assert REGISTRY.get_sample_value("normserve_ready") == 0
    assert REGISTRY.get_sample_value("normserve_inference_requests_in_flight_limit") == 3
    admission.ready = ready_
    admission.draining = draining  # set in a signal handler: published apart, as the drain does on its loop
    assert REGISTRY.get_sample_value("normserve_ready") == int(ready_)
    admission.publish()
    assert REGISTRY.get_sample_value("normserve_ready") == gauge


def test_enter_names_the_reason_the_worker_is_not_ready() -> None:
    admission = Admission(4)
    admission.not_ready_reason = "model check failed: models/manifest.json: manifest missing; run `normserve export`"
    with pytest.raises(NotReady) as e:
        admission.enter()
    assert e.value.message == (
        "server is not ready: model check failed: models/manifest.json: manifest missing; run `normserve export`"
    )


@pytest.mark.parametrize("is_ready", [True, False], ids=["ready", "not-ready"])
def test_enter_while_draining_is_shutting_down_whether_ready_or_not(is_ready: bool) -> None:
    admission = Admission(4)
    admission.ready, admission.draining = is_ready, True
    with pytest.raises(NotReady) as e:
        admission.enter()
    assert e.value.message == "server is shutting down; retry on another replica"
    assert admission.count() == 0


@pytest.mark.parametrize("limit", [1, 3])
def test_enter_past_the_limit_is_overloaded_and_leave_frees_a_slot(limit: int) -> None:
    admission = ready(limit)
    for n in range(1, limit + 1):
        admission.enter()
        assert admission.count() == n
    with pytest.raises(Overloaded) as e:
        admission.enter()
    assert e.value.message == f"{limit} requests in flight, the limit (NORMSERVE_MAX_IN_FLIGHT)"
    assert admission.count() == limit  # the refused one never counted
    admission.leave()
    admission.enter()  # the slot it freed is taken again
    assert admission.count() == limit


@pytest.mark.parametrize(
    ("is_ready", "draining", "accepting", "reason"),
    [
        (True, False, True, "models are loading"),  # the reason is only read while not accepting
        (False, False, False, "models are loading"),
        (True, True, False, "shutting down"),
        (False, True, False, "shutting down"),
    ],
)
def test_accepting_and_its_reason_follow_readiness_and_draining(
    is_ready: bool, draining: bool, accepting: bool, reason: str
) -> None:
    admission = Admission(1)
    admission.ready, admission.draining = is_ready, draining
    assert (admission.accepting, admission.not_accepting_reason) == (accepting, reason)


def test_wait_idle_is_true_at_once_when_nothing_is_in_flight() -> None:
    t0 = time.monotonic()
    assert ready().wait_idle(5.0) is True
    assert time.monotonic() - t0 < 1.0


def test_wait_idle_is_false_after_the_timeout_while_a_request_stays() -> None:
    admission = ready()
    admission.enter()
    t0 = time.monotonic()
    assert admission.wait_idle(0.2) is False
    assert time.monotonic() - t0 >= 0.2
    assert admission.count() == 1


def test_wait_idle_wakes_when_the_last_request_leaves_from_another_thread() -> None:
    admission = ready()
    admission.enter()
    admission.enter()
    leaver = threading.Timer(0.1, lambda: (admission.leave(), time.sleep(0.1), admission.leave()))
    t0 = time.monotonic()
    leaver.start()
    try:
        assert admission.wait_idle(10.0) is True
    finally:
        leaver.join()
    assert 0.2 <= time.monotonic() - t0 < 5.0  # after the second leave, not the first, and not at the timeout
    assert admission.count() == 0


def test_count_is_exact_under_concurrent_enters_and_leaves() -> None:
    admission = ready(8)
    peak = [0]
    lock = threading.Lock()

    def client() -> None:
        for _ in range(500):
            try:
                admission.enter()
            except Overloaded:
                continue
            with lock:
                peak[0] = max(peak[0], admission.count())
            admission.leave()

    threads = [threading.Thread(target=client) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert admission.count() == 0 and peak[0] <= 8


def test_abandon_all_cancels_every_waiting_request_and_says_how_many() -> None:
    admission = ready()

    async def scenario() -> list[bool]:
        scopes = [anyio.CancelScope() for _ in range(3)]
        admission.abandonable.update(scopes)
        assert admission.abandon_all() == 3
        return [scope.cancel_called for scope in scopes]

    assert anyio.run(scenario) == [True, True, True]
    assert Admission(1).abandon_all() == 0


@pytest.mark.parametrize("setting", [1, 10, 10**9])
def test_the_connection_limit_is_the_setting_within_half_the_free_descriptors(setting: int) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    expected = setting if soft == resource.RLIM_INFINITY else max(1, min(setting, (soft - FD_RESERVE) // 2))
    assert connection_limit(Settings(max_connections=setting)) == expected
    assert connection_limit(Settings(max_connections=setting)) <= setting
