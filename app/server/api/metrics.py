"""GET /metrics: Prometheus text format, every worker's figures in multiprocess mode."""

from __future__ import annotations

import anyio
from fastapi import APIRouter
from starlette.responses import Response

from app.server.http.direct import DirectRoute
from app.server.telemetry import metrics

router = APIRouter(tags=["operations"], route_class=DirectRoute)  # answers HEAD too

# Its own limiter: a scrape never waits behind inferences for a thread of the default pool.
_scrapes = anyio.CapacityLimiter(2)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {metrics.CONTENT_TYPE: {}}, "description": "Prometheus text format"}},
)
async def prometheus_metrics() -> Response:
    """Request counts and latencies per route and status, inference time and batch size per model,
    inferences in flight, model load time and parity figures (README, "Metrics")."""
    if metrics.multiprocess_dir() is None:
        body = metrics.render()  # in-memory values: well under a millisecond, fine on the event loop
    else:
        body = await anyio.to_thread.run_sync(metrics.render, limiter=_scrapes)  # reads every worker's files
    return Response(body, media_type=metrics.CONTENT_TYPE)
