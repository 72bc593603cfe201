"""The drift monitor's Prometheus series: per model version and LayerNorm, the live histograms of the per-position
input mean and std (buckets from that LayerNorm's baseline) and the drift gauge with its window's sample count.

prometheus-client's Histogram has one bucket set per metric, not per label set, so a collector builds the families
at each scrape from the versions' ModelMonitors (app/core/monitor.py). With several workers (multiprocess mode)
each worker counts its own share of the traffic in its own window, and a scrape answers with the worker it reaches:
the drift of a sample of the traffic, which the PSI tolerates (docs/operations.md says so).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from app.core.model import Model
from app.core.monitor import Histogram

LABELS = ["model", "version", "layer"]


class MonitorCollector(Collector):
    """Reads the serving models' monitors at each scrape; `source` is set by the worker's data plane."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[Model]] = list

    def collect(self) -> Iterator[Metric]:
        mean = HistogramMetricFamily(
            "normserve_layernorm_input_mean", "Per-position input mean of each LayerNorm (live traffic).", labels=LABELS
        )
        std = HistogramMetricFamily(
            "normserve_layernorm_input_std", "Per-position input std of each LayerNorm (live traffic).", labels=LABELS
        )
        drift = GaugeMetricFamily(
            "normserve_layernorm_drift",
            "PSI of the window's input stds against the export's baseline (< 0.1 stable, > 0.25 drifted); "
            "NaN for an empty window.",
            labels=LABELS,
        )
        samples = GaugeMetricFamily(
            "normserve_layernorm_drift_samples", "Positions in the drift window of each LayerNorm.", labels=LABELS
        )
        for model in self.source():
            monitor = model.monitor
            monitor.flush()
            for layer, d in monitor.layers.items():
                labels = [model.name, model.version, layer]
                counts = d.window.counts()
                total = int(counts.sum())
                drift.add_metric(labels, d.psi() if total else math.nan)
                samples.add_metric(labels, total)
                means, stds = monitor.histograms[layer]
                mean.add_metric(labels, *_buckets(means))
                std.add_metric(labels, *_buckets(stds))
        yield from (mean, std, drift, samples)


def _buckets(histogram: Histogram) -> tuple[list[tuple[str, float]], float]:
    counts, total = histogram.snapshot()
    cumulative = counts.cumsum()
    edges = [repr(float(e)) for e in histogram.edges] + ["+Inf"]
    return [(le, float(c)) for le, c in zip(edges, cumulative, strict=True)], total


COLLECTOR = MonitorCollector()
