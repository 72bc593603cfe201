"""LayerNorm input statistics as a drift monitor: a baseline from export, a window of live counts, and their PSI.

A LayerNorm's input is summarised per position (a row of a layernorm model, a token of an encoder) by its
mean and its std (population: sqrt of the variance the LayerNorm divides by, without eps). At export the
distribution of those over the parity or calibration inputs becomes the baseline: a fixed set of quantiles.
Live, the same per-position stds are counted into the bins the baseline's deciles cut, over a sliding
window, and compared with the fractions the baseline expects there by the population stability index:

    PSI = sum_i (a_i - e_i) * ln(a_i / e_i)      a_i, e_i: the window's and the baseline's fraction in bin i

Thresholds, as credit scoring has used them since the 1990s (and Evidently, whylogs, SageMaker Model Monitor):
below 0.1 stable, 0.1 to 0.25 a moderate shift worth a look, above 0.25 drifted.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]

# Deciles for the PSI bins (ten of 0.1 each), tails for the histogram buckets to resolve the extremes.
LEVELS = (0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999)
DECILES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# An empty bin would make ln(a/e) infinite: both fractions are floored here, the usual choice (1e-4 .. 1e-6).
PSI_EPSILON = 1e-4
STABLE, DRIFTED = 0.1, 0.25  # below STABLE: stable; above DRIFTED: drifted; between: a moderate shift
WINDOW_SLOTS = 10  # the window slides in tenths: an observation leaves it at most window_s / 10 late
LAYERNORM_LAYER = "layernorm"  # a layernorm model's one LayerNorm, as the manifest and the `layer` label name it


@dataclass(frozen=True)
class Distribution:
    """Quantiles of one statistic at LEVELS, over `count` positions."""

    count: int
    quantiles: tuple[float, ...]  # one per LEVELS, non-decreasing

    def at(self, levels: Sequence[float]) -> Array:
        return np.array([self.quantiles[LEVELS.index(p)] for p in levels])


@dataclass(frozen=True)
class Baseline:
    """One LayerNorm's baseline: the distributions of its per-position input mean and std."""

    mean: Distribution
    std: Distribution

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.mean.count,
            "levels": list(LEVELS),
            "mean": list(self.mean.quantiles),
            "std": list(self.std.quantiles),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Baseline:
        if list(doc["levels"]) != list(LEVELS):
            raise ValueError(f"baseline levels {doc['levels']} are not {list(LEVELS)}")
        count = int(doc["count"])
        return cls(
            Distribution(count, tuple(map(float, doc["mean"]))), Distribution(count, tuple(map(float, doc["std"])))
        )


def distribution(values: npt.ArrayLike) -> Distribution:
    """Quantiles of the finite values at LEVELS (linear interpolation, NumPy's default)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        raise ValueError("a baseline needs at least one finite value")
    return Distribution(int(v.size), tuple(float(q) for q in np.quantile(v, LEVELS)))


def baseline(means: npt.ArrayLike, stds: npt.ArrayLike) -> Baseline:
    """The baseline of one LayerNorm from its per-position input means and stds (any shapes, same count)."""
    return Baseline(distribution(means), distribution(stds))


def bucket_edges(dist: Distribution) -> list[float]:
    """Prometheus histogram `le` edges that resolve the baseline: every quantile at LEVELS, plus a decade each
    side of the extremes (where a x10 or x0.1 shift lands), distinct and increasing."""
    q = np.asarray(dist.quantiles)
    low, high = float(q[0]), float(q[-1])
    tails = [low - 9 * abs(low) if low <= 0 else low / 10, high + 9 * abs(high) if high >= 0 else high / 10]
    return sorted({round(float(x), 12) for x in (*q, *tails)})


def psi_edges(dist: Distribution) -> Array:
    """The inner edges of the PSI bins: the baseline's distinct deciles (ties merge bins)."""
    return np.unique(dist.at(DECILES))


def expected_fractions(dist: Distribution) -> Array:
    """The fraction of the baseline in each PSI bin, (-inf, d1], (d1, d2], ..., (d_last, inf).

    Ten bins of 0.1 when the deciles are distinct; tied deciles pool their bins' fractions into one.
    """
    deciles = dist.at(DECILES)
    edges = psi_edges(dist)
    bounds = np.array([0.0, *DECILES, 1.0])
    bins = np.searchsorted(edges, deciles, side="left")  # the bin each decile closes
    fractions = np.zeros(edges.size + 1)
    for level_bin, width in zip(np.append(bins, edges.size), np.diff(bounds), strict=True):
        fractions[level_bin] += width
    return fractions


def bin_counts(edges: Array, values: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """How many values fall in each bin (-inf, e0], (e0, e1], ..., (e_last, inf); NaN counts in the last."""
    index = np.searchsorted(edges, np.asarray(values, dtype=np.float64).ravel(), side="left")
    return np.bincount(index, minlength=edges.size + 1).astype(np.int64)


def psi(counts: npt.ArrayLike, expected: npt.ArrayLike, epsilon: float = PSI_EPSILON) -> float:
    """Population stability index of observed bin counts against expected bin fractions; NaN with no counts."""
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum()
    if total == 0:
        return math.nan  # an empty window is not stable: it has no evidence either way
    actual = np.maximum(c / total, epsilon)
    e = np.maximum(np.asarray(expected, dtype=np.float64), epsilon)
    return float(np.sum((actual - e) * np.log(actual / e)))


def verdict(value: float) -> str:
    """The documented reading of a PSI value."""
    if math.isnan(value):
        return "no data"
    return "stable" if value < STABLE else "moderate" if value <= DRIFTED else "drifted"


class Window:
    """Counts per bin over the last window_s seconds: a ring of WINDOW_SLOTS time slots, thread-safe.

    add() costs O(bins) under the lock (the caller bins its values first, off the lock); counts() sums the
    slots still inside the window. clock is injectable so tests step time instead of sleeping.
    """

    def __init__(self, bins: int, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self._width = window_s / WINDOW_SLOTS
        self._clock = clock
        self._lock = threading.Lock()
        self._counts = np.zeros((WINDOW_SLOTS, bins), dtype=np.int64)
        self._epoch = np.full(WINDOW_SLOTS, -1, dtype=np.int64)  # which time slot each ring entry holds

    def _now(self) -> int:
        return int(self._clock() // self._width)

    def add(self, counts: npt.NDArray[np.int64], at: float | None = None) -> None:
        """Counts observed now, or at the clock time `at` (a gathering binned later: ModelMonitor)."""
        now = self._now() if at is None else int(at // self._width)
        slot = now % WINDOW_SLOTS
        with self._lock:
            if self._epoch[slot] > now or now <= self._now() - WINDOW_SLOTS:  # its slot has left the window
                return
            if self._epoch[slot] != now:  # the entry last held a slot that has left the window
                self._counts[slot] = 0
                self._epoch[slot] = now
            self._counts[slot] += counts

    def counts(self) -> npt.NDArray[np.int64]:
        oldest = self._now() - WINDOW_SLOTS
        with self._lock:
            return np.asarray(self._counts[self._epoch > oldest].sum(axis=0), dtype=np.int64)


class Histogram:
    """Cumulative counts of one statistic in Prometheus buckets (`le` edges, +Inf last) and its sum: never reset,
    as a Prometheus histogram. observe() bins its values off the lock (O(values log edges)), adds under it."""

    def __init__(self, edges: Sequence[float]) -> None:
        self.edges = np.asarray(edges, dtype=np.float64)
        self._lock = threading.Lock()
        self._counts = np.zeros(self.edges.size + 1, dtype=np.int64)
        self._sum = 0.0

    def observe(self, values: npt.ArrayLike) -> None:
        v = np.asarray(values, dtype=np.float64).ravel()
        counts = np.bincount(np.searchsorted(self.edges, v, side="left"), minlength=self.edges.size + 1)
        total = float(v.sum())
        with self._lock:
            self._counts += counts
            self._sum += total

    def snapshot(self) -> tuple[npt.NDArray[np.int64], float]:
        """(count per bucket, not cumulative; the last is above every edge), sum."""
        with self._lock:
            return self._counts.copy(), self._sum


class Drift:
    """One LayerNorm's live std distribution against its baseline, over a window."""

    def __init__(self, base: Baseline, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.baseline = base
        self.edges = psi_edges(base.std)
        self.expected = expected_fractions(base.std)
        self.window = Window(self.edges.size + 1, window_s, clock)

    def observe(self, stds: npt.ArrayLike, at: float | None = None) -> None:
        self.window.add(bin_counts(self.edges, stds), at)

    def samples(self) -> int:
        return int(self.window.counts().sum())

    def psi(self) -> float:
        return psi(self.window.counts(), self.expected)
