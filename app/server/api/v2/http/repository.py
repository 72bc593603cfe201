"""Triton's model repository and model configuration extensions over HTTP: index, load, unload, config.

Thin routes on the worker's lifecycle (app/server/lifecycle.py): the admin token first
(app/server/api/admin.py), then the name is checked (app/core/repository.py) before any path is
built from it. Loads and unloads queue, one at a time, and run on the worker's control thread
(app/server/operations.py): a load's session build and warm-up take seconds of CPU, and inference
on every other model goes on meanwhile, its threadpool never held by a call waiting its turn.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from app.core.repository import check_name
from app.core.tensors import loads
from app.core.versionstate import State
from app.errors import InvalidInput, shown
from app.server.api.admin import check_token
from app.server.api.v2 import config
from app.server.api.v2.http import openapi
from app.server.http.body import read_body
from app.server.http.direct import DirectRoute
from app.server.http.responses import json_response
from app.server.worker import Worker

router = APIRouter(tags=["v2 repository"], route_class=DirectRoute)


async def _admin_body(
    request: Request, worker: Worker, allowed: dict[str, type], action: str | None = None
) -> dict[str, Any]:
    """The token, then the optional JSON body: an object whose fields and parameters are the allowed ones."""
    check_token(request.headers.getlist("authorization"), worker.settings, action)
    body = await read_body(request, worker.settings)
    doc = loads(body, "body") if body.strip() else {}
    if not isinstance(doc, dict):
        raise InvalidInput(f"expected a JSON object, got {shown(doc)}", "body")
    params = doc.get("parameters", {})
    fields = {k: v for k, v in doc.items() if k != "parameters"}
    if not isinstance(params, dict):
        raise InvalidInput(f"expected an object, got {shown(params)}", "parameters")
    for where, values in (("", fields), ("parameters.", params)):
        for key, value in values.items():
            kind = allowed.get(f"{where}{key}")
            if kind is None:
                known = ", ".join(allowed) or "none"
                raise InvalidInput(f"not supported; the repository folder is what loads (accepted: {known})", key)
            if not isinstance(value, kind):
                raise InvalidInput(f"expected a {kind.__name__}, got {shown(value)}", f"{where}{key}")
    return {**fields, **params}


@router.post("/v2/repository/index", **openapi.V2_REPOSITORY_INDEX)
async def index(request: Request, worker: Worker) -> Response:
    """Every version in the repository folder with its state (READY, UNAVAILABLE, LOADING, UNLOADING) and reason."""
    doc = await _admin_body(request, worker, {"ready": bool})
    rows = [r for r in worker.lifecycle.index() if r.state is State.READY or not doc.get("ready")]
    return json_response(
        [{"name": r.name, "version": str(r.version), "state": r.state.value, "reason": r.reason} for r in rows]
    )


@router.post("/v2/repository/models/{name}/load", **openapi.V2_REPOSITORY_CONTROL)
async def load(name: str, request: Request, worker: Worker) -> Response:
    """Load the versions the model's version_policy selects (sha256, session, parity warm-up), then retire the
    others; 200 once they serve, 400 with the reason when a load fails (what served goes on serving)."""
    await _admin_body(request, worker, {}, "load")
    worker.lifecycle.check_explicit("load", check_name(name))
    models = await worker.lifecycle.load(name)
    serving = worker.lifecycle.serving_versions(name)
    return json_response({"name": name, "loaded": [m.version for m in models], "serving": [str(v) for v in serving]})


@router.post("/v2/repository/models/{name}/unload", **openapi.V2_REPOSITORY_CONTROL)
async def unload(name: str, request: Request, worker: Worker) -> Response:
    """Stop serving every version of the model; requests already running on one finish on it."""
    await _admin_body(request, worker, {"parameters.unload_dependents": bool}, "unload")
    worker.lifecycle.check_explicit("unload", check_name(name))
    versions = await worker.lifecycle.unload(name)
    return json_response({"name": name, "unloaded": [str(v) for v in versions]})


@router.get("/v2/models/{name}/config", **openapi.V2_CONFIG)
async def model_config(name: str, worker: Worker) -> Response:
    """Triton's model configuration (what tritonclient's get_model_config returns)."""
    return json_response(config.to_json(config.model_config(worker.plane.model(name))))


@router.get("/v2/models/{name}/versions/{version}/config", **openapi.V2_CONFIG)
async def model_version_config(name: str, version: str, worker: Worker) -> Response:
    return json_response(config.to_json(config.model_config(worker.plane.model(name, version))))
