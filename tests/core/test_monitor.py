"""app/core/monitor.py: baselines, bucket edges, PSI against hand-computed figures, the sliding window."""

from __future__ import annotations

import json
import math
import threading
from typing import Any

import numpy as np
import pytest

from app.core import monitor
from app.core.dataplane import EncodeOutput, ModelInfo, NormalizeOutput
from app.core.monitor import LEVELS, Baseline, Drift, Window
from app.core.reference import EncoderConfig, encoder, layer_norm
from tests.live_server import ROOT


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


# ---- one model version's monitor: the answers' statistics against its manifest's baseline ----------------------


def committed(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((ROOT / "models" / name / "1" / "manifest.json").read_text())
    return doc


def encoder_answer_statistics(name: str, x: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """The committed encoder's per-token statistics of x, as its answers carry them (the reference's)."""
    manifest = committed(name)
    with np.load(ROOT / "models" / name / "1" / "weights.npz") as npz:
        weights = {k: npz[k].astype(np.float64) for k in npz.files}
    _, stats = encoder(x, weights, EncoderConfig(**manifest["config"]))
    answer = EncodeOutput(x.astype(np.float32), stats, ModelInfo(name, "1", ""), None)
    return monitor.output_statistics(answer)


@pytest.mark.parametrize("name", ["encoder", "encoder-preln"])
def test_traffic_like_the_baseline_is_stable_and_x10_drifts_the_first_layernorm(name: str) -> None:
    """Traffic shaped as the parity inputs (the baseline's: mostly full 512-token sequences), another seed."""
    runs = {}
    for scale in (1.0, 10.0):
        mon = monitor.ModelMonitor(name, "1", committed(name)["baseline"], 300.0, Clock())
        rng = np.random.default_rng(7)
        for shape in ((2, 512), (3, 7), (1, 1), (1, 512)):
            mon.observe(encoder_answer_statistics(name, scale * rng.standard_normal((*shape, 128))))
        runs[scale] = {layer["name"]: layer for layer in mon.report()["layers"]}
    assert all(layer["samples"] == 1558 and layer["psi"] < 0.1 for layer in runs[1.0].values())
    assert {layer["verdict"] for layer in runs[1.0].values()} == {"stable"}
    assert runs[10.0]["layers.0.norm1"]["psi"] > 0.25 and runs[10.0]["layers.0.norm1"]["verdict"] == "drifted"


def test_a_version_exported_before_the_monitor_says_it_has_no_baseline() -> None:
    mon = monitor.ModelMonitor("old", "3", None, 60.0, Clock())
    mon.observe([("layernorm", np.zeros(4), np.ones(4))])
    assert mon.report() == {
        "model": "old",
        "version": "3",
        "window_s": 60.0,
        "baseline": "no baseline: this version was exported before the drift monitor; export it again to monitor it",
        "layers": [],
    }


def test_an_empty_window_reports_null_psi_and_no_samples() -> None:
    (layer,) = monitor.ModelMonitor("layernorm", "1", committed("layernorm")["baseline"], 60.0, Clock()).report()[
        "layers"
    ]
    assert (layer["name"], layer["psi"], layer["samples"], layer["verdict"]) == ("layernorm", None, 0, "no data")
    assert layer["baseline"] == committed("layernorm")["baseline"]["layers"]["layernorm"]


def test_a_layernorm_answers_statistics_are_its_rows_mean_and_std() -> None:
    x = np.array([[1.0, 3.0], [2.0, 2.0], [0.0, 4.0]])
    r = layer_norm(x)
    answer = NormalizeOutput(r.output, r.mean, r.var, 1e-5, "var", "numpy", None, None)
    ((name, means, stds),) = monitor.output_statistics(answer)
    assert name == "layernorm" and means.tolist() == [2.0, 2.0, 2.0] and stds.tolist() == [1.0, 0.0, 2.0]


def test_an_encoders_answer_statistics_leave_padded_tokens_out() -> None:
    mean, std = np.arange(6.0).reshape(2, 3), np.arange(6.0).reshape(2, 3) + 10
    answer = EncodeOutput(
        np.zeros((2, 3, 4), np.float32), [("layers.0.norm1", mean, std)], ModelInfo("e", "1", ""), None
    )
    mask = np.array([[False, False, True], [False, True, True]])
    ((name, means, stds),) = monitor.output_statistics(answer, mask)
    assert (name, means.tolist(), stds.tolist()) == ("layers.0.norm1", [0.0, 1.0, 3.0], [10.0, 11.0, 13.0])


@pytest.mark.parametrize(
    ("fraction", "draws", "expected"),
    [(1.0, [0.99], [True]), (0.0, [0.0], [False]), (0.25, [0.1, 0.3, 0.24, 0.9], [True, False, True, False])],
)
def test_sampling_counts_the_fraction_of_requests_asked(
    fraction: float, draws: list[float], expected: list[bool]
) -> None:
    it = iter(draws)
    assert [monitor.sampled(fraction, lambda: next(it)) for _ in expected] == expected


def test_a_text_encoders_answer_statistics_leave_the_attention_masks_padding_out() -> None:
    from app.core.textencoder import TextInput, TextOutput
    from app.server.pipeline import _padding

    mean, std = np.arange(6.0).reshape(2, 3), np.arange(6.0).reshape(2, 3) + 10
    request = TextInput(np.ones((2, 3), np.int64), np.array([[1, 1, 1], [1, 0, 0]], np.int64))
    answer = TextOutput(np.zeros((2, 4), np.float32), [("embeddings.LayerNorm", mean, std)], ModelInfo("t", "1", ""))
    ((name, means, stds),) = monitor.output_statistics(answer, _padding(request))
    assert (name, means.tolist(), stds.tolist()) == (
        "embeddings.LayerNorm",
        [0.0, 1.0, 2.0, 3.0],
        [10.0, 11.0, 12.0, 13.0],
    )


def layernorm_monitor(clock: Clock) -> monitor.ModelMonitor:
    return monitor.ModelMonitor("layernorm", "1", committed("layernorm")["baseline"], 60.0, clock)


def std_histogram_count(mon: monitor.ModelMonitor) -> int:
    counts, _ = mon.histograms[monitor.LAYERNORM_LAYER][1].snapshot()
    return int(counts.sum())


@pytest.mark.parametrize("answers", [1, monitor.GATHER - 1])
def test_answers_gathered_but_not_yet_binned_count_once_a_reader_asks(answers: int) -> None:
    mon = layernorm_monitor(Clock())
    for _ in range(answers):
        mon.observe([(monitor.LAYERNORM_LAYER, np.zeros(8), np.ones(8))])
    assert std_histogram_count(mon) == 0  # gathered, not binned
    assert mon.report()["layers"][0]["samples"] == 8 * answers
    assert std_histogram_count(mon) == 8 * answers


def test_a_full_gathering_is_binned_without_a_reader() -> None:
    mon = layernorm_monitor(Clock())
    for _ in range(monitor.GATHER):
        mon.observe([(monitor.LAYERNORM_LAYER, np.zeros(8), np.ones(8))])
    assert std_histogram_count(mon) == 8 * monitor.GATHER


def test_a_gathering_a_window_slot_old_is_binned_at_the_next_answer() -> None:
    clock = Clock()
    mon = layernorm_monitor(clock)
    mon.observe([(monitor.LAYERNORM_LAYER, np.zeros(8), np.ones(8))])
    clock.now += 60.0 / monitor.WINDOW_SLOTS
    mon.observe([(monitor.LAYERNORM_LAYER, np.zeros(8), np.ones(8))])
    assert std_histogram_count(mon) == 16


def test_answers_gathered_before_the_window_passed_leave_it_when_read_late() -> None:
    """A gathering counts at the time of its first answer: read after the window has passed, it is out of it."""
    clock = Clock()
    mon = layernorm_monitor(clock)
    mon.observe([(monitor.LAYERNORM_LAYER, np.zeros(8), np.ones(8))])
    clock.now += 61.0
    layer = mon.report()["layers"][0]
    assert (layer["samples"], layer["psi"]) == (0, None)
    assert std_histogram_count(mon) == 8  # the histograms are cumulative, as Prometheus'
