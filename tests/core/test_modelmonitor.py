"""app/core/modelmonitor.py: a served version's monitor, its answers' statistics, sampling and gathering."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from app.core import modelmonitor, monitor
from app.core.dataplane import EncodeOutput, ModelInfo, NormalizeOutput
from app.core.reference import EncoderConfig, encoder, layer_norm
from tests.core.test_monitor import Clock
from tests.live_server import ROOT

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
    return modelmonitor.output_statistics(answer)


@pytest.mark.parametrize("name", ["encoder", "encoder-preln"])
def test_traffic_like_the_baseline_is_stable_and_x10_drifts_the_first_layernorm(name: str) -> None:
    """Traffic shaped as the parity inputs (the baseline's: mostly full 512-token sequences), another seed."""
    runs = {}
    for scale in (1.0, 10.0):
        mon = modelmonitor.ModelMonitor(name, "1", committed(name)["baseline"], 300.0, Clock())
        rng = np.random.default_rng(7)
        for shape in ((2, 512), (3, 7), (1, 1), (1, 512)):
            mon.observe(encoder_answer_statistics(name, scale * rng.standard_normal((*shape, 128))))
        runs[scale] = {layer["name"]: layer for layer in mon.report()["layers"]}
    assert all(layer["samples"] == 1558 and layer["psi"] < 0.1 for layer in runs[1.0].values())
    assert {layer["verdict"] for layer in runs[1.0].values()} == {"stable"}
    assert runs[10.0]["layers.0.norm1"]["psi"] > 0.25 and runs[10.0]["layers.0.norm1"]["verdict"] == "drifted"


def test_a_version_exported_before_the_monitor_says_it_has_no_baseline() -> None:
    mon = modelmonitor.ModelMonitor("old", "3", None, 60.0, Clock())
    mon.observe([("layernorm", np.zeros(4), np.ones(4))])
    assert mon.report() == {
        "model": "old",
        "version": "3",
        "window_s": 60.0,
        "baseline": "no baseline: this version was exported before the drift monitor; export it again to monitor it",
        "layers": [],
    }


def test_an_empty_window_reports_null_psi_and_no_samples() -> None:
    (layer,) = modelmonitor.ModelMonitor("layernorm", "1", committed("layernorm")["baseline"], 60.0, Clock()).report()[
        "layers"
    ]
    assert (layer["name"], layer["psi"], layer["samples"], layer["verdict"]) == ("layernorm", None, 0, "no data")
    assert layer["baseline"] == committed("layernorm")["baseline"]["layers"]["layernorm"]


def test_a_layernorm_answers_statistics_are_its_rows_mean_and_std() -> None:
    x = np.array([[1.0, 3.0], [2.0, 2.0], [0.0, 4.0]])
    r = layer_norm(x)
    answer = NormalizeOutput(r.output, r.mean, r.var, 1e-5, "var", "numpy", None, None)
    ((name, means, stds),) = modelmonitor.output_statistics(answer)
    assert name == "layernorm" and means.tolist() == [2.0, 2.0, 2.0] and stds.tolist() == [1.0, 0.0, 2.0]


def test_an_encoders_answer_statistics_leave_padded_tokens_out() -> None:
    mean, std = np.arange(6.0).reshape(2, 3), np.arange(6.0).reshape(2, 3) + 10
    answer = EncodeOutput(
        np.zeros((2, 3, 4), np.float32), [("layers.0.norm1", mean, std)], ModelInfo("e", "1", ""), None
    )
    mask = np.array([[False, False, True], [False, True, True]])
    ((name, means, stds),) = modelmonitor.output_statistics(answer, mask)
    assert (name, means.tolist(), stds.tolist()) == ("layers.0.norm1", [0.0, 1.0, 3.0], [10.0, 11.0, 13.0])


@pytest.mark.parametrize(
    ("fraction", "draws", "expected"),
    [(1.0, [0.99], [True]), (0.0, [0.0], [False]), (0.25, [0.1, 0.3, 0.24, 0.9], [True, False, True, False])],
)
def test_sampling_counts_the_fraction_of_requests_asked(
    fraction: float, draws: list[float], expected: list[bool]
) -> None:
    it = iter(draws)
    assert [modelmonitor.sampled(fraction, lambda: next(it)) for _ in expected] == expected


def test_a_text_encoders_answer_statistics_leave_the_attention_masks_padding_out() -> None:
    from app.core.textencoder import TextInput, TextOutput
    from app.server.pipeline import _padding

    mean, std = np.arange(6.0).reshape(2, 3), np.arange(6.0).reshape(2, 3) + 10
    request = TextInput(np.ones((2, 3), np.int64), np.array([[1, 1, 1], [1, 0, 0]], np.int64))
    answer = TextOutput(np.zeros((2, 4), np.float32), [("embeddings.LayerNorm", mean, std)], ModelInfo("t", "1", ""))
    ((name, means, stds),) = modelmonitor.output_statistics(answer, _padding(request))
    assert (name, means.tolist(), stds.tolist()) == (
        "embeddings.LayerNorm",
        [0.0, 1.0, 2.0, 3.0],
        [10.0, 11.0, 12.0, 13.0],
    )


def layernorm_monitor(clock: Clock) -> modelmonitor.ModelMonitor:
    return modelmonitor.ModelMonitor("layernorm", "1", committed("layernorm")["baseline"], 60.0, clock)


def std_histogram_count(mon: modelmonitor.ModelMonitor) -> int:
    counts, _ = mon.histograms[monitor.LAYERNORM_LAYER][1].snapshot()
    return int(counts.sum())


@pytest.mark.parametrize("answers", [1, modelmonitor.GATHER - 1])
def test_answers_gathered_but_not_yet_binned_count_once_a_reader_asks(answers: int) -> None:
    mon = layernorm_monitor(Clock())
    for _ in range(answers):
        mon.observe([(monitor.LAYERNORM_LAYER, np.zeros(8), np.ones(8))])
    assert std_histogram_count(mon) == 0  # gathered, not binned
    assert mon.report()["layers"][0]["samples"] == 8 * answers
    assert std_histogram_count(mon) == 8 * answers


def test_a_full_gathering_is_binned_without_a_reader() -> None:
    mon = layernorm_monitor(Clock())
    for _ in range(modelmonitor.GATHER):
        mon.observe([(monitor.LAYERNORM_LAYER, np.zeros(8), np.ones(8))])
    assert std_histogram_count(mon) == 8 * modelmonitor.GATHER


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


def test_a_gathering_holding_many_values_is_binned_before_it_is_full() -> None:
    """Large answers are binned without waiting for GATHER of them: what is held stays bounded."""
    mon = layernorm_monitor(Clock())
    rows = modelmonitor.GATHER_VALUES // 2
    mon.observe([(monitor.LAYERNORM_LAYER, np.zeros(rows), np.ones(rows))])
    assert std_histogram_count(mon) == 0
    mon.observe([(monitor.LAYERNORM_LAYER, np.zeros(rows), np.ones(rows))])
    assert std_histogram_count(mon) == 2 * rows
