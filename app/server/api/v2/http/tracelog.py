"""Triton's trace and logging extensions over HTTP: GET/POST /v2/trace/setting, /v2/models/{name}/trace/setting
and /v2/logging, behind the admin token (NORMSERVE_ADMIN_TOKEN; closed without one).

Each worker process has its own settings: with several workers a POST reaches the one worker that
accepted its connection (docs/operations.md). Out of /openapi.json, as the admin routes are meant
for operators, and a fuzzer posting random settings would change the very server it tests.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from app.errors import MalformedBody
from app.server.api.admin import check_token
from app.server.http.body import read_body
from app.server.http.direct import DirectRoute
from app.server.http.responses import json_response
from app.server.telemetry import logsettings, tracing
from app.server.worker import Worker

router = APIRouter(tags=["v2"], route_class=DirectRoute, include_in_schema=False)


async def _changes(request: Request, worker: Worker) -> dict[str, Any]:
    body = await read_body(request, worker.settings)
    try:
        changes = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as e:
        raise MalformedBody(f"not valid JSON ({e})", "body") from None
    if not isinstance(changes, dict):
        raise MalformedBody("expected a JSON object of settings", "body")
    return changes


def _authorized(request: Request, worker: Worker) -> None:
    check_token(request.headers.getlist("authorization"), worker.settings)


@router.get("/v2/trace/setting")
async def trace_setting(request: Request, worker: Worker) -> Response:
    """The trace settings in force in this worker: trace_level, trace_rate, trace_count (Triton's names)."""
    _authorized(request, worker)
    return json_response(tracing.STATE.settings.get())


@router.post("/v2/trace/setting")
async def update_trace_setting(request: Request, worker: Worker) -> Response:
    _authorized(request, worker)
    return json_response(tracing.STATE.settings.update(await _changes(request, worker)))


@router.get("/v2/models/{name}/trace/setting")
async def model_trace_setting(name: str, request: Request, worker: Worker) -> Response:
    """One model's trace settings: its own values, else the server-wide ones."""
    _authorized(request, worker)
    return json_response(tracing.STATE.settings.get(worker.plane.model(name).name))


@router.post("/v2/models/{name}/trace/setting")
async def update_model_trace_setting(name: str, request: Request, worker: Worker) -> Response:
    _authorized(request, worker)
    model = worker.plane.model(name).name
    return json_response(tracing.STATE.settings.update(await _changes(request, worker), model))


@router.get("/v2/logging")
async def log_settings(request: Request, worker: Worker) -> Response:
    """log_info, log_warning, log_error, log_verbose_level, log_format, log_file as Triton names them."""
    _authorized(request, worker)
    return json_response(logsettings.get())


@router.post("/v2/logging")
async def update_log_settings(request: Request, worker: Worker) -> Response:
    _authorized(request, worker)
    return json_response(logsettings.update(await _changes(request, worker)))
