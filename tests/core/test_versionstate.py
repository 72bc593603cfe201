"""A version's state as the repository index words it (Triton's names), and its row."""

from __future__ import annotations

import pytest

from app.core.versionstate import IndexRow, State, VersionState


@pytest.mark.parametrize("name", ["READY", "UNAVAILABLE", "LOADING", "UNLOADING"])
def test_a_state_is_written_as_tritons_name(name: str) -> None:
    assert State(name) == name and str(State(name)) == name


@pytest.mark.parametrize(("state", "reason"), [(State.READY, ""), (State.UNAVAILABLE, "model.onnx: sha256 mismatch")])
def test_a_version_state_carries_its_reason_and_a_row_its_fields(state: State, reason: str) -> None:
    held = VersionState(state, reason) if reason else VersionState(state)
    assert (held.state, held.reason) == (state, reason)
    assert IndexRow("m", 2, held.state, held.reason)._asdict() == {
        "name": "m",
        "version": 2,
        "state": state,
        "reason": reason,
    }
