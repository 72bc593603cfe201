"""app/core/monitor.py: baselines, bucket edges, PSI against hand-computed figures, the sliding window."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from app.core import monitor
from app.core.monitor import LEVELS, Baseline, Drift, Window


class Clock:
    """A clock the test steps: the window's expiry without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def normal_stds(rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
    """Per-row stds of N(0, scale^2) rows of 64: what a layernorm model's input rows give."""
    return np.asarray((scale * rng.standard_normal((n, 64))).std(axis=1))


@pytest.mark.parametrize(
    ("counts", "expected", "psi"),
    [
        ([30, 70], [0.5, 0.5], 0.2 * math.log(0.5 / 0.3) + 0.2 * math.log(0.7 / 0.5)),  # 0.16946
        ([10, 20, 30, 40], [0.25] * 4, 0.22822),
        ([0, 10], [0.5, 0.5], (0.5 - 1e-4) * math.log(0.5 / 1e-4) + 0.5 * math.log(2)),  # empty bin floored: 4.60432
        ([5, 5], [0.5, 0.5], 0.0),
    ],
    ids=["two-bins", "four-bins", "empty-bin-epsilon", "identical"],
)
def test_psi_matches_hand_computed_figures(counts: list[int], expected: list[float], psi: float) -> None:
    assert monitor.psi(counts, expected) == pytest.approx(psi, abs=1e-5)


def test_psi_of_no_counts_is_nan_not_stable() -> None:
    assert math.isnan(monitor.psi([0, 0], [0.5, 0.5]))
    assert monitor.verdict(math.nan) == "no data"


@pytest.mark.parametrize(
    ("value", "reading"), [(0.0, "stable"), (0.099, "stable"), (0.1, "moderate"), (0.25, "moderate"), (0.26, "drifted")]
)
def test_verdict_follows_the_documented_thresholds(value: float, reading: str) -> None:
    assert monitor.verdict(value) == reading


def test_distribution_quantiles_at_levels_skip_non_finite_values() -> None:
    values = np.append(np.arange(1001, dtype=np.float64), [np.nan, np.inf])
    dist = monitor.distribution(values)
    assert dist.count == 1001
    assert dist.quantiles == pytest.approx([1000 * p for p in LEVELS])


def test_distribution_of_nothing_finite_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^a baseline needs at least one finite value$"):
        monitor.distribution([np.nan])


def test_baseline_round_trips_through_json() -> None:
    base = monitor.baseline(np.arange(100.0), np.arange(100.0) + 1)
    doc = base.to_json()
    assert doc["count"] == 100 and doc["levels"] == list(LEVELS)
    assert Baseline.from_json(doc) == base


def test_baseline_with_other_levels_is_refused() -> None:
    doc = monitor.baseline(np.arange(10.0), np.arange(10.0)).to_json() | {"levels": [0.5]}
    with pytest.raises(ValueError, match=r"^baseline levels \[0.5\] are not \[0.001, "):
        Baseline.from_json(doc)


@pytest.mark.parametrize("scale", [1.0, 1e-3, 1e3])
def test_bucket_edges_resolve_the_baseline_and_a_decade_each_side(scale: float) -> None:
    dist = monitor.distribution(scale * np.linspace(1.0, 2.0, 1000))
    edges = monitor.bucket_edges(dist)
    assert edges == sorted(set(edges))
    assert edges[0] == pytest.approx(scale * 0.1001, rel=1e-3) and edges[-1] == pytest.approx(scale * 19.99, rel=1e-3)
    inside = np.histogram(scale * np.linspace(1.0, 2.0, 1000), bins=edges)[0]
    assert (inside > 0).sum() >= 10  # the deciles of the baseline land in buckets of their own


def test_expected_fractions_are_tenths_with_distinct_deciles_and_pool_ties() -> None:
    distinct = monitor.distribution(np.arange(1000.0))
    assert monitor.expected_fractions(distinct) == pytest.approx([0.1] * 10)
    tied = monitor.distribution(np.r_[np.zeros(601), np.arange(1.0, 400.0)])  # deciles 1..6 are all 0
    assert monitor.psi_edges(tied).size == 4
    assert monitor.expected_fractions(tied) == pytest.approx([0.6, 0.1, 0.1, 0.1, 0.1])


def test_bin_counts_follow_prometheus_le_boundaries() -> None:
    edges = np.array([1.0, 2.0])
    assert monitor.bin_counts(edges, [0.5, 1.0, 1.5, 2.0, 2.5, np.nan]).tolist() == [2, 2, 2]


def test_window_expires_old_observations_with_the_clock() -> None:
    clock = Clock()
    window = Window(2, 10.0, clock)
    window.add(np.array([1, 2]))
    clock.now += 5.0
    window.add(np.array([10, 0]))
    assert window.counts().tolist() == [11, 2]
    clock.now += 5.5  # the first observation's slot is 10.5 s old: gone; the second's 5.5 s: kept
    assert window.counts().tolist() == [10, 0]
    clock.now += 5.0
    assert window.counts().tolist() == [0, 0]
    window.add(np.array([0, 3]))  # a ring entry reused after a lap starts from zero
    assert window.counts().tolist() == [0, 3]


def test_window_counts_every_add_from_many_threads() -> None:
    window = Window(3, 60.0)

    def add() -> None:
        for _ in range(1000):
            window.add(np.array([1, 0, 2]))

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert window.counts().tolist() == [4000, 0, 8000]


def test_window_of_no_length_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^window_s must be positive, got 0$"):
        Window(2, 0)


@pytest.mark.parametrize(("scale", "low", "high"), [(1.0, 0.0, 0.1), (10.0, 0.25, math.inf), (0.1, 0.25, math.inf)])
def test_drift_reads_in_distribution_traffic_as_stable_and_scaled_traffic_as_drifted(
    scale: float, low: float, high: float
) -> None:
    rng = np.random.default_rng(0)
    base = monitor.baseline(np.zeros(2000), normal_stds(rng, 2000))
    drift = Drift(base, 300.0, Clock())
    for _ in range(20):  # requests of 64 rows each
        drift.observe(normal_stds(rng, 64, scale))
    assert drift.samples() == 1280
    assert low <= drift.psi() < high


def test_drift_of_an_empty_window_has_no_samples_and_no_psi() -> None:
    drift = Drift(monitor.baseline(np.zeros(10), np.arange(10.0)), 300.0, Clock())
    assert drift.samples() == 0 and math.isnan(drift.psi())
