"""The shared model-state folder's files: written whole, and read as untrusted (never followed, never blocked on)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from app.server.statefile import (
    INVALID_ACK,
    MAX_STATE_BYTES,
    STARTING,
    StateInvalid,
    checked,
    read_ack,
    read_state,
    write_state,
)

VALID = {"generation": 3, "serving": {"m": [1, 2]}, "policies": {}, "states": {"m/1": ["READY", ""]}}


def test_a_written_state_reads_back_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    write_state(tmp_path / "state.json", VALID)
    assert checked(read_state(tmp_path / "state.json")) == VALID
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    assert (tmp_path / "state.json").stat().st_mode & 0o777 == 0o600


def test_a_missing_file_reads_as_none(tmp_path: Path) -> None:
    assert read_state(tmp_path / "state.json") is None


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.symlink_to(p.with_name("elsewhere.json")), "a symbolic link"),
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: p.write_bytes(b" " * (MAX_STATE_BYTES + 1)), f"larger than {MAX_STATE_BYTES} bytes"),
        (lambda p: p.write_bytes(b"{"), "not JSON"),
    ],
    ids=["link", "fifo", "too-large", "not-json"],
)
def test_a_file_no_worker_wrote_is_refused_naming_what_it_is(tmp_path: Path, make: Any, message: str) -> None:
    make(tmp_path / "state.json")
    with pytest.raises(StateInvalid) as e:
        read_state(tmp_path / "state.json")
    assert str(e.value) == message


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"generation": 0}, "generation: expected an integer >= 1, got 0"),
        ({"serving": {"m": [0]}}, "serving: expected model names, each with a list of versions"),
        (
            {"policies": {"other": {"latest": {"num_versions": 1}}}},
            "policies: expected the policy of models that serve",
        ),
        ({"states": []}, "states: expected an object"),
        ({"states": {"m/1": ["READY"]}}, "states.m/1: expected [state, reason]"),
    ],
)
def test_a_document_of_another_shape_names_its_first_wrong_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(StateInvalid) as e:
        checked(VALID | change)
    assert str(e.value) == message


@pytest.mark.parametrize(
    ("doc", "ack"),
    [
        (None, (STARTING, None)),
        ({"generation": 4, "error": None}, (4, None)),
        ({"generation": 4, "error": "boom"}, (4, "boom")),
        (
            {"generation": 4, "error": 1},
            (INVALID_ACK, "its acknowledgement is invalid: expected an object of generation and error"),
        ),
        (
            {"generation": -3},
            (INVALID_ACK, "its acknowledgement is invalid: generation: expected an integer >= -1, got -3"),
        ),
    ],
)
def test_an_acknowledgement_reads_as_generation_and_error(
    tmp_path: Path, doc: Any, ack: tuple[int, str | None]
) -> None:
    if doc is not None:
        write_state(tmp_path / "worker-1.json", doc)
    assert read_ack(tmp_path / "worker-1.json") == ack
