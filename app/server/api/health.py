"""Liveness and readiness, as the V2 protocol names them; Kubernetes probes point here."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from app.server.api import openapi
from app.server.http.direct import DirectRoute
from app.server.http.responses import json_response, readiness
from app.server.worker import Worker

router = APIRouter(tags=["health"], route_class=DirectRoute)


@router.get("/v2/health/live", **openapi.HEALTH_LIVE)
async def live() -> Response:
    """Live as long as the process serves, whatever the models' state."""
    return json_response({"live": True})


@router.get("/v2/health/ready", **openapi.HEALTH_READY)
async def ready(worker: Worker) -> Response:
    """Ready only after every model passed its sha256 check and parity warm-up, and not while draining."""
    return readiness(worker.admission, {})
