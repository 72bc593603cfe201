"""app.stats: Triton's statistics format, stage timing, and exact counts under concurrent updates."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import REGISTRY

from app.server.telemetry.statistics import Statistics
from app.server.telemetry.timer import STAGES, InferTimer


def _timed() -> InferTimer:
    timer = InferTimer()
    for stage in STAGES:
        time.sleep(0.001)
        timer.mark(stage)
    return timer


def test_report_of_an_unused_model_is_all_zeros_in_tritons_shape() -> None:
    (entry,) = Statistics().report([("layernorm", "1")])["model_stats"]
    assert entry["name"] == "layernorm" and entry["version"] == "1" and entry["batch_stats"] == []
    assert entry["last_inference"] == entry["inference_count"] == entry["execution_count"] == 0
    assert set(entry["inference_stats"]) >= {"success", "fail", *STAGES}
    assert all(d == {"count": 0, "ns": 0} for d in entry["inference_stats"].values())


def test_success_adds_each_stage_once_and_stages_sum_to_at_most_the_total() -> None:
    stats = Statistics()
    stats.record_success("m", "1", _timed())
    (entry,) = stats.report([("m", "1")])["model_stats"]
    inf = entry["inference_stats"]
    assert entry["inference_count"] == inf["success"]["count"] == 1
    assert entry["execution_count"] == 0  # executions are onnxruntime runs, recorded as they happen
    assert all(inf[s]["count"] == 1 and inf[s]["ns"] >= 1_000_000 for s in STAGES)
    assert sum(inf[s]["ns"] for s in STAGES) <= inf["success"]["ns"]
    assert abs(entry["last_inference"] - time.time() * 1000) < 5_000  # ms since the epoch
    assert inf["fail"] == {"count": 0, "ns": 0}


def test_executions_count_apart_from_requests_each_of_batch_size_one_as_max_batch_size_is_zero() -> None:
    stats = Statistics()
    for ns in (100, 10, 200):  # e.g. two requests merged into one run, then one alone, then a chunk of a large one
        stats.record_execution("m", "1", ns)
    (entry,) = stats.report([("m", "1")])["model_stats"]
    assert (entry["execution_count"], entry["inference_count"]) == (3, 0)
    zero = {"count": 0, "ns": 0}
    assert entry["batch_stats"] == [
        {"batch_size": 1, "compute_input": zero, "compute_infer": {"count": 3, "ns": 310}, "compute_output": zero},
    ]


def test_failure_counts_only_as_a_failure() -> None:
    stats = Statistics()
    timer = InferTimer()
    timer.mark("queue")  # failed while decoding: the stages it passed are not counted either
    stats.record_failure("m", "1", timer)
    (entry,) = stats.report([("m", "1")])["model_stats"]
    assert entry["inference_stats"]["fail"]["count"] == 1 and entry["inference_stats"]["fail"]["ns"] > 0
    assert entry["inference_count"] == entry["inference_stats"]["queue"]["count"] == 0


@pytest.mark.parametrize("threads", [2, 8])
def test_concurrent_updates_are_counted_exactly(threads: int) -> None:
    stats, per_thread, timer = Statistics(), 500, _timed()

    def work() -> None:
        for i in range(per_thread):
            (stats.record_success if i % 5 else stats.record_failure)("m", "1", timer)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    (entry,) = stats.report([("m", "1")])["model_stats"]
    assert entry["inference_count"] == threads * per_thread * 4 // 5
    assert entry["inference_stats"]["fail"]["count"] == threads * per_thread // 5
    assert entry["inference_stats"]["compute_infer"]["count"] == entry["inference_count"]


def test_versions_are_kept_apart() -> None:
    stats = Statistics()
    stats.record_success("m", "1", _timed())
    one, two = stats.report([("m", "1"), ("m", "2")])["model_stats"]
    assert (one["version"], one["inference_count"]) == ("1", 1)
    assert (two["version"], two["inference_count"]) == ("2", 0)


@pytest.mark.parametrize(("warm_up", "executions"), [(False, 1), (True, 0)], ids=["request", "warm-up"])
def test_a_models_report_of_a_run_is_an_execution_unless_the_warm_up_ran_it(warm_up: bool, executions: int) -> None:
    labels = {"model": "observed", "version": "1"}
    before = REGISTRY.get_sample_value("normserve_inference_duration_seconds_count", labels) or 0.0
    stats = Statistics()
    stats.observe_run("observed", "1", 0.002, 8, warm_up)
    (report,) = stats.report([("observed", "1")])["model_stats"]
    assert report["execution_count"] == executions
    ns = [b["compute_infer"]["ns"] for b in report["batch_stats"]]
    assert ns == ([2_000_000] if executions else [])
    assert REGISTRY.get_sample_value("normserve_inference_duration_seconds_count", labels) == before + 1
