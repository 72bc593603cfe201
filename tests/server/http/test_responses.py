"""app/server/http/responses.py: JSON answers serialized by orjson, and the readiness answer of a worker's admission."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from app.server.admission import Admission
from app.server.http.responses import json_response, readiness


@pytest.mark.parametrize(
    ("obj", "body"),
    [
        ({"ready": True}, b'{"ready":true}'),
        ({"output": np.array([[0.5, -1.0]], np.float32)}, b'{"output":[[0.5,-1.0]]}'),
        ({"mean": np.array([0.2, 0.25]), "shape": [2]}, b'{"mean":[0.2,0.25],"shape":[2]}'),
        ([1, "two", None], b'[1,"two",null]'),
    ],
    ids=["dict", "float32-array", "float64-array", "list"],
)
def test_json_response_is_orjson_with_numpy_arrays_as_lists(obj: object, body: bytes) -> None:
    r = json_response(obj)
    assert (r.status_code, r.body, r.media_type) == (200, body, "application/json")
    assert r.headers["content-type"] == "application/json"
    assert r.headers["content-length"] == str(len(body))


def test_json_response_carries_its_status_and_headers() -> None:
    r = json_response({"error": "x"}, 503, headers={"Retry-After": "1"})
    assert (r.status_code, r.headers["retry-after"], orjson.loads(r.body)) == (503, "1", {"error": "x"})


def admission(ready: bool, draining: bool, reason: str | None = None) -> Admission:
    a = Admission(1)
    a.ready, a.draining = ready, draining
    if reason is not None:
        a.not_ready_reason = reason
    return a


@pytest.mark.parametrize(
    ("ready", "draining", "reason", "status", "answer"),
    [
        (True, False, None, 200, {"ready": True}),
        (False, False, None, 503, {"ready": False, "error": "not ready: models are loading"}),
        (False, False, "parity warm-up running", 503, {"ready": False, "error": "not ready: parity warm-up running"}),
        (True, True, None, 503, {"ready": False, "error": "not ready: shutting down"}),
        (False, True, "parity warm-up running", 503, {"ready": False, "error": "not ready: shutting down"}),
    ],
    ids=["ready", "loading", "warming-up", "draining", "draining-while-loading"],
)
def test_readiness_is_200_only_while_accepting_else_503_with_the_reason_and_retry_after(
    ready: bool, draining: bool, reason: str | None, status: int, answer: dict[str, Any]
) -> None:
    r = readiness(admission(ready, draining, reason), {})
    assert (r.status_code, orjson.loads(r.body)) == (status, answer)
    assert r.headers.get("retry-after") == (None if status == 200 else "1")


@pytest.mark.parametrize(("ready", "status"), [(True, 200), (False, 503)])
def test_readiness_keeps_the_fields_it_was_given(ready: bool, status: int) -> None:
    r = readiness(admission(ready, False), {"name": "layernorm"})
    assert r.status_code == status
    assert orjson.loads(r.body) == (
        {"name": "layernorm", "ready": True}
        if ready
        else {"name": "layernorm", "ready": False, "error": "not ready: models are loading"}
    )
