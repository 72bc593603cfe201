"""The Open Inference Protocol (KServe V2 / Triton HTTP): metadata, readiness, infer and statistics.

Thin routes on the data plane: app/server/api/v2/http/codec.py reads and writes the wire format, the model's kind
turns tensors into the data plane's input and back, the data plane finds the model and runs it. Health routes are
in health.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from app import __version__
from app.errors import ExtensionNotSupported
from app.server.api.v2 import rules
from app.server.api.v2.http import codec, openapi
from app.server.dataplane import DataPlane
from app.server.http.body import read_body
from app.server.http.direct import DirectRoute, hot
from app.server.http.responses import json_response, readiness

router = APIRouter(tags=["v2"], route_class=DirectRoute)  # no dependency solving

EXTENSIONS = [
    "binary_tensor_data",
    "parameters",
    "statistics",
    "model_repository",
    "model_configuration",
    "trace",
    "logging",
]
STREAM_BYTES = 1 << 20  # answers above this go out in slices of this size


@router.get("/v2", **openapi.V2_SERVER)
@router.get("/v2/", include_in_schema=False)  # as /v2: a redirect's absolute location is wrong behind TLS ingress
async def server_metadata() -> Response:
    """Server name, version and the protocol extensions it supports."""
    return json_response({"name": "normserve", "version": __version__, "extensions": EXTENSIONS})


# Declared before /v2/models/{name}, which would otherwise take "stats" for a model name (as in Triton).
@router.get("/v2/models/stats", **openapi.V2_ALL_STATS)
async def all_model_stats(plane: DataPlane) -> Response:
    """Triton statistics of every model."""
    return json_response(plane.statistics())


@router.get("/v2/models/{name}", **openapi.V2_METADATA)
async def model_metadata(name: str, plane: DataPlane) -> Response:
    """Inputs, outputs, datatypes and shapes (-1 = any size; layernorm's [-1] input takes any rank >= 1)."""
    return json_response(plane.metadata(name))


@router.get("/v2/models/{name}/versions/{version}", **openapi.V2_METADATA)
async def model_version_metadata(name: str, version: str, plane: DataPlane) -> Response:
    return json_response(plane.metadata(name, version))


@router.get("/v2/models/{name}/ready", **openapi.V2_READY)
async def model_ready(name: str, plane: DataPlane) -> Response:
    """200 when the model is known and the server ready (verified, not draining); 503 otherwise."""
    return readiness(plane.admission, {"name": plane.model(name).name})


@router.get("/v2/models/{name}/versions/{version}/ready", **openapi.V2_READY)
async def model_version_ready(name: str, version: str, plane: DataPlane) -> Response:
    return readiness(plane.admission, {"name": plane.model(name, version).name})


@router.post("/v2/models/{name}/infer", **openapi.V2_INFER)
@hot
async def infer(name: str, request: Request, plane: DataPlane) -> Response:
    """Infer with JSON or binary tensors (Inference-Header-Content-Length), gzip/deflate either way."""
    return await _infer(request, plane, name)


@router.post("/v2/models/{name}/versions/{version}/infer", **openapi.V2_INFER)
@hot
async def infer_version(name: str, version: str, request: Request, plane: DataPlane) -> Response:
    return await _infer(request, plane, name, version)


@router.get("/v2/models/{name}/stats", **openapi.V2_STATS)
async def model_stats(name: str, plane: DataPlane) -> Response:
    """Triton statistics of one model, each version serving: counts and cumulative ns per stage, executions per
    batch size."""
    return json_response(plane.statistics(name))


@router.get("/v2/models/{name}/versions/{version}/stats", **openapi.V2_STATS)
async def model_version_stats(name: str, version: str, plane: DataPlane) -> Response:
    return json_response(plane.statistics(name, version))


# Triton's shared-memory routes (status, register and unregister, of one region or all): 400 naming the extension.
@router.api_route("/v2/systemsharedmemory/{path:path}", methods=["GET", "POST"], include_in_schema=False)
async def system_shared_memory(path: str) -> Response:
    raise ExtensionNotSupported(rules.SHARED_MEMORY["systemsharedmemory"])


@router.api_route("/v2/cudasharedmemory/{path:path}", methods=["GET", "POST"], include_in_schema=False)
async def cuda_shared_memory(path: str) -> Response:
    raise ExtensionNotSupported(rules.SHARED_MEMORY["cudasharedmemory"])


async def _infer(request: Request, plane: DataPlane, name: str, version: str | None = None) -> Response:
    headers, settings = request.headers, plane.settings
    infer = codec.InferCodec(name, version, settings, headers.get(codec.HEADER_LENGTH), headers.get("accept-encoding"))
    return _response(await plane.infer(infer, read_body(request, settings)))


def _response(out: codec.EncodedResponse) -> Response:
    """Small answers in one piece; large binary ones part by part, straight from the output arrays.

    Joining a 64 MiB output into one bytes object, which the transport then also buffers, held the
    body three times at once (peak RSS, docs/benchmarks.md section 5). Each part goes out whole, as
    a memoryview: uvloop writes what the socket takes and keeps a reference to the rest, no copy, and
    uvicorn's flow control waits for the drain before the next part. 1 MiB slices, each copied into
    bytes, cost (8,128,768) 7.1 ms of server CPU a request against 6.75 now (medians of 5 rounds of
    80, scripts/server_cpu.py --case v2binary).
    """
    if out.length <= STREAM_BYTES or len(out.parts) == 1:
        return Response(out.body, headers=out.headers, media_type=out.media_type)

    async def parts() -> AsyncIterator[memoryview]:
        for part in out.parts:
            yield memoryview(part).cast("B")

    headers = {**out.headers, "Content-Length": str(out.length)}  # a length, not chunked: as Triton answers
    return StreamingResponse(parts(), headers=headers, media_type=out.media_type)
