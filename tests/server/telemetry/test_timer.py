"""InferTimer: the stages in Triton's order, each from the end of the one before, and the input's shape."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from app.server.telemetry.timer import STAGES, InferTimer


@pytest.mark.parametrize("marked", [STAGES, STAGES[:2], ("queue", "compute_infer")])
def test_durations_are_the_marked_stages_each_from_the_previous_mark(marked: tuple[str, ...]) -> None:
    timer = InferTimer()
    for stage in marked:
        timer.mark(stage)
    durations = timer.durations()
    assert list(durations) == [s for s in STAGES if s in marked]
    assert all(ns >= 0 for ns in durations.values())
    assert sum(durations.values()) == timer.marks[marked[-1]] - timer.start <= timer.elapsed()


@pytest.mark.parametrize("marked", [STAGES, STAGES[:2], ()])
def test_stages_run_end_to_end_from_the_start_to_the_last_mark(marked: tuple[str, ...]) -> None:
    timer = InferTimer()
    for stage in marked:
        timer.mark(stage)
    stages = timer.stages()
    assert [stage for stage, _, _ in stages] == list(marked)
    ends = [timer.start] + [timer.marks[stage] for stage in marked]
    assert [(begin, end) for _, begin, end in stages] == list(itertools.pairwise(ends))


@pytest.mark.parametrize(
    ("request_", "shape"),
    [(SimpleNamespace(x=np.zeros((2, 3, 4), np.float32)), (2, 3, 4)), (SimpleNamespace(), None), (None, None)],
)
def test_note_input_keeps_the_input_tensors_shape_when_it_has_one(request_: object, shape: object) -> None:
    timer = InferTimer()
    timer.note_input(request_)
    assert timer.shape == shape
