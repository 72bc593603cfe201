"""app/server/telemetry/tracesettings.py: Triton's trace_level, trace_rate and trace_count, server-wide and per model."""

from __future__ import annotations

from typing import Any

import pytest

from app.errors import InvalidInput
from app.server.telemetry.tracesettings import TraceSettings


def _taken(settings: TraceSettings, model: str | None, n: int) -> list[bool]:
    return [settings.sample(model) for _ in range(n)]


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({}, [True] * 6),
        ({"trace_rate": "3"}, [True, False, False, True, False, False]),
        ({"trace_count": "2"}, [True, True, False, False, False, False]),
        ({"trace_rate": 2, "trace_count": ["2"]}, [True, False, True, False, False, False]),
        ({"trace_level": ["OFF"]}, [False] * 6),
        ({"trace_count": "0"}, [False] * 6),
    ],
    ids=["default", "rate-3", "count-2", "rate-2-count-2", "off", "count-0"],
)
def test_rate_and_count_pick_the_inference_requests_traced(changes: dict[str, Any], pattern: list[bool]) -> None:
    settings = TraceSettings(exporting=True)
    settings.update(changes)
    assert _taken(settings, "layernorm", 6) == pattern


def test_a_models_own_values_override_the_server_wide_ones_with_their_own_counter() -> None:
    settings = TraceSettings(exporting=True)
    settings.update({"trace_rate": "2"})
    settings.update({"trace_count": "1"}, "encoder")
    assert _taken(settings, "encoder", 4) == [True, False, False, False]  # its count; the server-wide rate
    # Not encoder's count; the server-wide rate's one counter, whose first turn encoder took.
    assert _taken(settings, "layernorm", 4) == [False, True, False, True]
    assert settings.get("encoder")["trace_count"] == "0" and settings.get()["trace_count"] == "-1"
    settings.update({"trace_count": None}, "encoder")
    assert settings.get("encoder") == settings.get()


def test_a_model_level_on_while_the_server_is_off_still_traces_that_model() -> None:
    settings = TraceSettings(exporting=True)
    settings.update({"trace_level": ["OFF"]})
    assert not settings.any_on
    settings.update({"trace_level": ["TIMESTAMPS"]}, "encoder")
    assert settings.any_on and settings.sample("encoder") and not settings.sample("layernorm")
    assert not settings.sample(None, inference=False)  # health and metadata follow the server-wide level


def test_null_puts_a_server_wide_value_back_to_its_default() -> None:
    settings = TraceSettings(exporting=True)
    settings.update({"trace_rate": "5", "trace_level": ["OFF"]})
    assert settings.update({"trace_rate": None, "trace_level": None})["trace_rate"] == "1"
    assert settings.get()["trace_level"] == ["TIMESTAMPS"]


def test_off_by_default_without_an_exporter() -> None:
    settings = TraceSettings(exporting=False)
    assert settings.get()["trace_level"] == ["OFF"] and not settings.any_on and not settings.sample("layernorm")
    with pytest.raises(InvalidInput):
        settings.update({"trace_level": ["TIMESTAMPS"]})


def test_non_inference_requests_count_against_neither_rate_nor_count() -> None:
    settings = TraceSettings(exporting=True)
    settings.update({"trace_count": "1"})
    assert all(settings.sample(None, inference=False) for _ in range(3))
    assert settings.get()["trace_count"] == "1"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"trace_level": ["TIMESTAMPS", "TENSORS"]},
            "trace_level: expected ['OFF'] or ['TIMESTAMPS'] (TENSORS is not supported), got ['TIMESTAMPS', 'TENSORS']",
        ),
        ({"trace_rate": "x"}, "trace_rate: expected an integer >= 1 (as a string), got 'x'"),
        ({"trace_rate": "\u0662"}, "trace_rate: expected an integer >= 1 (as a string), got '\u0662'"),
        ({"trace_count": "1_000"}, "trace_count: expected an integer >= -1 (as a string), got '1_000'"),
        ({"trace_count": "\xa05"}, "trace_count: expected an integer >= -1 (as a string), got '\\xa05'"),
        ({"trace_rate": True}, "trace_rate: expected an integer >= 1 (as a string), got True"),
        ({"trace_count": ["1", "2"]}, "trace_count: expected an integer >= -1 (as a string), got ['1', '2']"),
        ({"log_frequency": "10"}, "log_frequency: is '0' in opentelemetry trace mode and cannot change"),
        ({"trace_mode": "triton"}, "trace_mode: is 'opentelemetry' in opentelemetry trace mode and cannot change"),
    ],
)
def test_a_bad_value_is_refused_whole(changes: dict[str, Any], message: str) -> None:
    settings = TraceSettings(exporting=True)
    before = settings.get()
    with pytest.raises(InvalidInput) as e:
        settings.update({"trace_rate": "7", **changes})
    assert e.value.message == message and settings.get() == before


def test_the_reported_fixed_values_are_accepted_back() -> None:
    settings = TraceSettings(exporting=True)
    assert settings.update(settings.get()) == settings.get()  # GET then POST it whole: a no-op
