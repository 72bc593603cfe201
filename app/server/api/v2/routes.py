"""The Open Inference Protocol (KServe V2 / Triton HTTP): metadata, readiness, infer and statistics.

Routes only translate HTTP; app/api/v2_schemas.py reads and writes the wire format,
app/api/v2_models.py maps tensors to the data plane. Health routes are in app/api/health.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from app import __version__
from app.core import v2spec as v2_models
from app.core.runtime import Model
from app.errors import RETRY_AFTER_S, ModelNotFound, NotReady
from app.server.api import openapi as docs
from app.server.api.body import read_body
from app.server.api.direct import DirectRoute
from app.server.api.errors import json_response
from app.server.api.v2 import codec as v2_schemas
from app.server.statistics import InferTimer, Stats
from app.server.worker import INLINE_BODY_BYTES, State, StateDep, run_inference

router = APIRouter(tags=["v2"], route_class=DirectRoute, responses=docs.V2_ERRORS)  # no per-request dependency solving

EXTENSIONS = ["binary_tensor_data", "parameters", "statistics"]
STREAM_BYTES = 1 << 20  # answers above this go out in slices of this size


async def get_stats(request: Request) -> Stats:  # async: no threadpool hop (see app/api/deps.py get_state)
    stats: Stats = request.app.state.stats
    return stats


StatsDep = Annotated[Stats, Depends(get_stats)]


def _model(state: State, name: str, version: str | None) -> Model:
    """The model, 404 if unknown; 503 while models are still loading, when unknown may just mean not yet."""
    try:
        return state.runtime.get(name, version)
    except ModelNotFound:
        if not state.admission.ready:
            raise NotReady(f"server is not ready: {state.admission.not_ready_reason}") from None
        raise


@router.get("/v2")
async def server_metadata() -> Response:
    """Server name, version and the protocol extensions it supports."""
    return json_response({"name": "normserve", "version": __version__, "extensions": EXTENSIONS})


# Declared before /v2/models/{name}, which would otherwise take "stats" for a model name (as in Triton).
@router.get("/v2/models/stats")
async def all_model_stats(state: StateDep, stats: StatsDep) -> Response:
    """Triton statistics of every model."""
    models = [(m.name, m.version) for m in state.runtime.models.values()]
    return json_response(stats.report(models))


@router.get("/v2/models/{name}")
async def model_metadata(name: str, state: StateDep) -> Response:
    """Inputs, outputs, datatypes and shapes (-1 = any size; layernorm's [-1] input takes any rank >= 1)."""
    return json_response(v2_models.describe(_model(state, name, None)).metadata())


@router.get("/v2/models/{name}/versions/{version}")
async def model_version_metadata(name: str, version: str, state: StateDep) -> Response:
    return json_response(v2_models.describe(_model(state, name, version)).metadata())


@router.get("/v2/models/{name}/ready")
async def model_ready(name: str, state: StateDep) -> Response:
    """200 when the model is known and the server ready (verified, not draining); 503 otherwise."""
    return _ready(_model(state, name, None), state)


@router.get("/v2/models/{name}/versions/{version}/ready")
async def model_version_ready(name: str, version: str, state: StateDep) -> Response:
    return _ready(_model(state, name, version), state)


def _ready(model: Model, state: State) -> Response:
    if state.admission.accepting:
        return json_response({"name": model.name, "ready": True})
    reason = "shutting down" if state.admission.draining else state.admission.not_ready_reason
    body = {"name": model.name, "ready": False, "error": f"not ready: {reason}"}
    return json_response(body, 503, headers={"Retry-After": str(RETRY_AFTER_S)})


@router.post("/v2/models/{name}/infer")
async def infer(name: str, request: Request, state: StateDep, stats: StatsDep) -> Response:
    """Infer with JSON or binary tensors (Inference-Header-Content-Length), gzip/deflate either way."""
    return await _infer(request, state, stats, _model(state, name, None))


@router.post("/v2/models/{name}/versions/{version}/infer")
async def infer_version(name: str, version: str, request: Request, state: StateDep, stats: StatsDep) -> Response:
    return await _infer(request, state, stats, _model(state, name, version))


@router.get("/v2/models/{name}/stats")
async def model_stats(name: str, state: StateDep, stats: StatsDep) -> Response:
    """Triton statistics of one model: counts and cumulative ns per stage."""
    model = _model(state, name, None)
    return json_response(stats.report([(model.name, model.version)]))


@router.get("/v2/models/{name}/versions/{version}/stats")
async def model_version_stats(name: str, version: str, state: StateDep, stats: StatsDep) -> Response:
    model = _model(state, name, version)
    return json_response(stats.report([(model.name, model.version)]))


async def _infer(request: Request, state: State, stats: Stats, model: Model) -> Response:
    timer = InferTimer()
    try:
        body = await read_body(request, state.settings.max_body_bytes)
        timer = InferTimer()  # the clock starts once the body is in memory, as Triton's does
        header_length = request.headers.get(v2_schemas.HEADER_LENGTH)
        accept = request.headers.get("accept-encoding")
        inline = len(body) <= INLINE_BODY_BYTES and model.batcher is None  # tiny: no thread hop (app/api/deps.py)
        out = await run_inference(
            state, lambda: _infer_job(state, model, body, header_length, accept, timer), inline=inline
        )
    except Exception:  # any answer but 200 counts as a failure; the handlers still answer it
        stats.record_failure(model.name, model.version, timer)
        raise
    stats.record_success(model.name, model.version, timer)
    return _response(out)


def _response(out: v2_schemas.EncodedResponse) -> Response:
    """Small answers in one piece; large binary ones in slices straight from the output arrays.

    Joining a 64 MiB output into one bytes object, which the transport then also buffers, held the
    body three times at once: streaming slices keeps it once (peak RSS, docs/benchmarks.md section 5).
    """
    if out.length <= STREAM_BYTES or len(out.parts) == 1:
        return Response(out.body, headers=out.headers, media_type=out.media_type)

    async def slices() -> AsyncIterator[bytes]:
        for part in out.parts:
            view = memoryview(part)
            for i in range(0, len(view), STREAM_BYTES):
                yield bytes(view[i : i + STREAM_BYTES])

    headers = {**out.headers, "Content-Length": str(out.length)}  # a length, not chunked: as Triton answers
    return StreamingResponse(slices(), headers=headers, media_type=out.media_type)


def _infer_job(
    state: State, model: Model, body: bytearray, header_length: str | None, accept: str | None, timer: InferTimer
) -> v2_schemas.EncodedResponse:
    """Runs in the threadpool: decode, the data plane, encode; each stage timed for the statistics."""
    timer.mark("queue")
    spec = v2_models.describe(model)
    req = v2_schemas.parse_infer(body, header_length, spec, state.settings)
    timer.mark("compute_input")
    results = v2_models.infer(state.runtime, spec, req.tensors, req.parameters)
    timer.mark("compute_infer")
    out = v2_schemas.build_response(spec, req, results, accept)
    timer.mark("compute_output")
    return out
