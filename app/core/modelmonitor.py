"""One model version's drift monitor: each LayerNorm's live statistics against its export's baseline.

The math (baselines, windows, histograms, PSI) is app/core/monitor.py; this is what a served version holds: its
answers' per-position statistics (`output_statistics`), the fraction of requests counted (`sampled`), gathered and
binned a batch at a time, and GET /v2/models/{name}/monitor's report.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from app.core.dataplane import NormalizeOutput
from app.core.monitor import (
    LAYERNORM_LAYER,
    WINDOW_SLOTS,
    Array,
    Baseline,
    Drift,
    Histogram,
    bucket_edges,
    psi,
    verdict,
)

# Answers gathered before they are binned together. Binning costs six NumPy calls per LayerNorm of ~1 us each
# whatever their size, which made the monitor 7.6% of a small /normalize's instructions (callgrind, 200 requests);
# gathered, they cost one list append per answer. A gathering is binned at once when a reader asks
# (report(), a Prometheus scrape) or once its oldest answer is a window slot old, so nothing is late by more.
GATHER = 32
# ... or once they hold this many statistics (positions x LayerNorms): a text encoder's answer of 256 texts of 256
# tokens holds 13 x 65,536 of each, and 32 of them held 218 MB until binned.
GATHER_VALUES = 16_384

NO_BASELINE = "no baseline: this version was exported before the drift monitor; export it again to monitor it"


def sampled(fraction: float, draw: Callable[[], float] = random.random) -> bool:
    """Whether this request is one the monitor counts (NORMSERVE_MONITOR_SAMPLE): every one at 1, none at 0."""
    return fraction >= 1 or (fraction > 0 and draw() < fraction)


def output_statistics(result: Any, padding_mask: npt.NDArray[np.bool_] | None = None) -> list[tuple[str, Array, Array]]:
    """Each LayerNorm's per-position input (mean, std) in an answer: a layernorm model's rows (its one LayerNorm),
    an encoder's or a text encoder's (`layer_norms`, mean and std B,T) unpadded tokens. The answer already holds
    them: nothing is computed again."""
    if isinstance(result, NormalizeOutput):
        return [(LAYERNORM_LAYER, result.mean.ravel(), np.sqrt(result.var.ravel()))]
    pad = None if padding_mask is None else np.asarray(padding_mask, dtype=bool)
    return [(name, mean, std) if pad is None else (name, mean[~pad.reshape(mean.shape)], std[~pad.reshape(mean.shape)])
            for name, mean, std in result.layer_norms]  # fmt: skip


class ModelMonitor:
    """One model version's drift per LayerNorm, from its manifest's baseline; none for a version without one."""

    def __init__(
        self,
        model: str,
        version: str,
        baseline_doc: Mapping[str, Any] | None,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model, self.version, self.window_s = model, version, window_s
        self.inputs = None if baseline_doc is None else str(baseline_doc.get("inputs", ""))
        layers = {} if baseline_doc is None else baseline_doc.get("layers", {})
        self.layers = {name: Drift(Baseline.from_json(doc), window_s, clock) for name, doc in layers.items()}
        # The live histograms' buckets resolve the baseline: its quantiles, and a decade beyond each extreme.
        self.histograms = {
            name: (Histogram(bucket_edges(d.baseline.mean)), Histogram(bucket_edges(d.baseline.std)))
            for name, d in self.layers.items()
        }
        self._clock, self._slot_s = clock, window_s / WINDOW_SLOTS
        self._gathered: list[Sequence[tuple[str, Array, Array]]] = []
        self._gathered_since = 0.0
        self._gathered_values = 0
        self._gather_lock = threading.Lock()

    def observe(self, statistics: Sequence[tuple[str, Array, Array]]) -> None:
        """Count one answer's per-position stds in each LayerNorm's window, and both statistics in its histograms
        (layers without a baseline skipped): gathered, binned with the next GATHER answers (see GATHER)."""
        if not self.layers:
            return
        now, values = self._clock(), sum(np.size(std) for _, _, std in statistics)
        with self._gather_lock:
            if not self._gathered:
                self._gathered_since, self._gathered_values = now, 0
            self._gathered.append(statistics)
            self._gathered_values += values
            full = len(self._gathered) >= GATHER or self._gathered_values >= GATHER_VALUES
            if not full and now - self._gathered_since < self._slot_s:
                return
            batch, since, self._gathered = self._gathered, self._gathered_since, []
        self._bin(batch, since)

    def flush(self) -> None:
        """Bin what is gathered: a reader sees every answer observed before it asked."""
        with self._gather_lock:
            batch, since, self._gathered = self._gathered, self._gathered_since, []
        if batch:
            self._bin(batch, since)

    def _bin(self, batch: list[Sequence[tuple[str, Array, Array]]], since: float) -> None:
        """The gathered answers binned: each LayerNorm's values of the whole batch in one NumPy call per histogram
        and window, the window's counts at the time the first of them was observed."""
        by_layer: dict[str, tuple[list[Array], list[Array]]] = {}
        for statistics in batch:
            for name, mean, std in statistics:
                if name in self.layers:
                    means, stds = by_layer.setdefault(name, ([], []))
                    means.append(np.ravel(mean))
                    stds.append(np.ravel(std))
        for name, (means, stds) in by_layer.items():
            std = np.concatenate(stds)
            self.layers[name].observe(std, since)
            mean_histogram, std_histogram = self.histograms[name]
            mean_histogram.observe(np.concatenate(means))
            std_histogram.observe(std)

    def report(self) -> dict[str, Any]:
        """GET /v2/models/{name}/monitor's answer (API.md section 13); psi is null for an empty window."""
        doc: dict[str, Any] = {"model": self.model, "version": self.version, "window_s": self.window_s}
        self.flush()
        if self.inputs is None:
            return doc | {"baseline": NO_BASELINE, "layers": []}
        return doc | {"baseline": self.inputs, "layers": [_layer_report(n, d) for n, d in self.layers.items()]}


def _layer_report(name: str, drift: Drift) -> dict[str, Any]:
    counts = drift.window.counts()
    value = psi(counts, drift.expected)
    live = {"std_bins": [float(e) for e in drift.edges], "counts": counts.tolist(), "expected": drift.expected.tolist()}
    return {
        "name": name,
        "psi": None if math.isnan(value) else value,
        "verdict": verdict(value),
        "samples": int(counts.sum()),
        "baseline": drift.baseline.to_json(),
        "live": live,
    }
