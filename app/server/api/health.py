"""Liveness and readiness, as the V2 protocol names them; Kubernetes probes point here."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from app.errors import RETRY_AFTER_S
from app.server.api.errors import json_response
from app.server.worker import StateDep

router = APIRouter(tags=["health"])


@router.get("/v2/health/live")
async def live() -> Response:
    """Live as long as the process serves, whatever the models' state."""
    return json_response({"live": True})


@router.get("/v2/health/ready", responses={503: {"description": "models not verified yet, or draining"}})
async def ready(state: StateDep) -> Response:
    """Ready only after every model passed its sha256 check and parity warm-up, and not while draining."""
    adm = state.admission
    if adm.accepting:
        return json_response({"ready": True})
    reason = "shutting down" if adm.draining else adm.not_ready_reason
    return json_response(
        {"ready": False, "error": f"not ready: {reason}"}, 503, headers={"Retry-After": str(RETRY_AFTER_S)}
    )
