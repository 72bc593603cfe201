"""Per-model inference statistics in the format of Triton's statistics extension, safe across threads.

Every protocol's inference requests count (REST, V2), once their model is known. Durations
follow Triton's meaning, measured from the moment the request body is in memory: queue =
waiting for admission and a worker thread, compute_input = decoding the tensors,
compute_infer = the data plane, compute_output = encoding (and compressing) the response.
success/fail ns are the whole request. Every inference request to a known model that does
not succeed counts as one failure, whatever stage it failed in.

An inference is a request; an execution is one onnxruntime run. Dynamic batching merges
requests into one run, and a large layernorm input runs in row chunks, so the two differ.
`batch_stats` counts every run as batch size 1, as Triton reports a model whose config says
`max_batch_size: 0` (the inputs carry their own batch dim, Triton adds none): a batch size there
would have to be Triton's batch dim, which these models have not. The rows per run are in the
Prometheus metric normserve_inference_batch_size. The load's parity warm-up is no execution.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from app.server.telemetry import metrics
from app.server.telemetry.timer import STAGES, InferTimer


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class ModelStats:
    name: str
    version: str
    last_inference: int = 0  # ms since the epoch, 0 before the first success (as Triton)
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    stages: dict[str, Duration] = field(default_factory=lambda: {s: Duration() for s in STAGES})
    batches: dict[int, Duration] = field(default_factory=dict)  # onnxruntime runs by batch size (always 1)

    def as_dict(self) -> dict[str, Any]:
        zero = Duration().as_dict()  # the run's tensors are the request's: no input or output stage of its own
        inference_stats = {"success": self.success.as_dict(), "fail": self.fail.as_dict()}
        inference_stats.update({s: d.as_dict() for s, d in self.stages.items()})
        # No response cache: Triton still reports these two, and some dashboards expect them.
        inference_stats.update({"cache_hit": Duration().as_dict(), "cache_miss": Duration().as_dict()})
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": inference_stats,
            "batch_stats": [
                {"batch_size": size, "compute_input": zero, "compute_infer": d.as_dict(), "compute_output": zero}
                for size, d in sorted(self.batches.items())
            ],
        }


class Statistics:
    """All models' statistics; one lock, held only for a few additions per request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[tuple[str, str], ModelStats] = {}

    def _entry(self, name: str, version: str) -> ModelStats:
        key = (name, version)
        if key not in self._models:
            self._models[key] = ModelStats(name, version)
        return self._models[key]

    def record_success(self, name: str, version: str, timer: InferTimer) -> None:
        durations, total = timer.durations(), timer.elapsed()
        with self._lock:
            entry = self._entry(name, version)
            entry.success.add(total)
            for stage, ns in durations.items():
                entry.stages[stage].add(ns)
            entry.inference_count += 1  # one request is one inference: the models have no batch dim of Triton's
            entry.last_inference = time.time_ns() // 1_000_000

    def record_execution(self, name: str, version: str, ns: int) -> None:
        """One onnxruntime run (merged requests, or one chunk of a large one): batch size 1, as max_batch_size is 0."""
        with self._lock:
            entry = self._entry(name, version)
            entry.execution_count += 1
            entry.batches.setdefault(1, Duration()).add(ns)

    def observe_run(self, model: str, version: str, seconds: float, rows: int, warm_up: bool) -> None:
        """A model's report of one run (app/core/runtime.py's RunObserver): the Prometheus metric of every run,
        and an execution here unless the warm-up ran it (at start or on a load: no client's execution)."""
        metrics.observe_inference(model, version, seconds, rows)
        if not warm_up:
            self.record_execution(model, version, int(seconds * 1e9))

    def record_failure(self, name: str, version: str, timer: InferTimer) -> None:
        total = timer.elapsed()
        with self._lock:
            self._entry(name, version).fail.add(total)

    def report(self, models: list[tuple[str, str]]) -> dict[str, Any]:
        """{"model_stats": [...]} for the given (name, version) pairs, zeros for models never called."""
        with self._lock:
            return {"model_stats": [self._entry(n, v).as_dict() for n, v in models]}
