"""POST /normalize and POST /encode: JSON in, JSON out; thin routes around the REST codec and the data plane."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from app.server.api.rest import codec, openapi
from app.server.dataplane import DataPlane
from app.server.http.body import read_body, require_json
from app.server.http.direct import DirectRoute, hot

router = APIRouter(tags=["normalization"], route_class=DirectRoute)  # no per-request dependency solving


@router.post("/normalize", **openapi.NORMALIZE)
@hot
async def normalize(request: Request, plane: DataPlane) -> Response:
    """Layer-normalize `data` over its trailing `normalized_shape` dims, with per-row statistics."""
    require_json(request)
    rest = codec.NormalizeCodec(plane.settings)
    payload = await plane.infer(rest, read_body(request, plane.settings))
    return Response(payload, media_type="application/json")


@router.post("/encode", **openapi.ENCODE)
@hot
async def encode(request: Request, plane: DataPlane) -> Response:
    """Run the Transformer encoder; report each LayerNorm's input statistics per position."""
    require_json(request)
    rest = codec.EncodeCodec(plane.settings)
    payload = await plane.infer(rest, read_body(request, plane.settings))
    return Response(payload, media_type="application/json")
