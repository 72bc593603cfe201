"""One request's clock: the ends of its stages, in Triton's names, read by the statistics and the trace.

The clock starts once the request is in memory (the body read, or grpc's message parsed), as Triton's
does; the stages then follow Triton's meaning (app/server/telemetry/statistics.py).
"""

from __future__ import annotations

import time
from typing import Any

from app.server.telemetry import tracing

STAGES = ("queue", "compute_input", "compute_infer", "compute_output")


class InferTimer:
    """Timestamps of one request's stages; marks come from the event loop and the worker thread in turn."""

    def __init__(self) -> None:
        self.start = time.perf_counter_ns()
        self.marks: dict[str, int] = {}
        self.model: tuple[str, str] | None = None  # (name, version), once the request names its model
        self.shape: tuple[int, ...] | None = None  # the input tensor's, once decoded: for the trace
        tracing.note_timer(self)  # the request's trace (if any) draws its stage spans from these marks

    def restart(self) -> None:
        """The request is in memory: its clock starts now (a body that failed to arrive counted from before)."""
        self.start = time.perf_counter_ns()

    def mark(self, stage: str) -> None:
        """The end of a stage (one of STAGES); each stage starts where the previous one ended."""
        self.marks[stage] = time.perf_counter_ns()

    def note_input(self, request: Any) -> None:
        """The data plane's input, decoded: its tensor's shape goes on the request's trace."""
        self.shape = getattr(getattr(request, "x", None), "shape", None)  # NumPy's: already a tuple of ints

    def stages(self) -> list[tuple[str, int, int]]:
        """(stage, start ns, end ns) of each stage marked, in order: for the statistics and the trace's spans."""
        out, prev = [], self.start
        for stage in STAGES:
            if stage in self.marks:
                out.append((stage, prev, self.marks[stage]))
                prev = self.marks[stage]
        return out

    def durations(self) -> dict[str, int]:
        return {stage: end - begin for stage, begin, end in self.stages()}

    def elapsed(self) -> int:
        return time.perf_counter_ns() - self.start
