"""Answers that every route builds: JSON serialized by orjson, and the 503 of a worker that is not accepting."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

from app.core.tensors import dumps
from app.errors import RETRY_AFTER_S
from app.server.admission import Admission


def json_response(obj: object, status_code: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """A JSON response serialized by orjson (NumPy arrays included)."""
    return Response(dumps(obj), status_code=status_code, headers=headers, media_type="application/json")


def readiness(admission: Admission, body: dict[str, Any]) -> Response:
    """200 with ready: true while the worker accepts inference; 503 with the reason and Retry-After otherwise."""
    if admission.accepting:
        return json_response({**body, "ready": True})
    not_ready = {**body, "ready": False, "error": f"not ready: {admission.not_accepting_reason}"}
    return json_response(not_ready, 503, headers={"Retry-After": str(RETRY_AFTER_S)})
