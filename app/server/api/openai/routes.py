"""POST /v1/embeddings and GET /v1/models as OpenAI's, and POST /tokenize: thin routes around the OpenAI codec.

Any `Authorization: Bearer` key is accepted (the official client always sends one): normserve has no inference
token, only the admin routes' NORMSERVE_ADMIN_TOKEN.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from app.server.api.openai import codec, openapi
from app.server.dataplane import DataPlane
from app.server.http.body import read_body, require_json
from app.server.http.direct import DirectRoute

router = APIRouter(tags=["text encoders"], route_class=DirectRoute)


@router.post("/v1/embeddings", **openapi.EMBEDDINGS)
async def embeddings(request: Request, plane: DataPlane) -> Response:
    """OpenAI's embeddings of texts or token ids, by a text encoder of the repository."""
    require_json(request)
    payload = await plane.infer(codec.EmbeddingsCodec(plane.settings), read_body(request, plane.settings))
    return Response(payload, media_type="application/json")


@router.get("/v1/models", **openapi.MODELS)
async def models(plane: DataPlane) -> Response:
    """The text encoders serving, as OpenAI lists models."""
    return Response(codec.models_list(plane.runtime.models), media_type="application/json")


@router.post("/tokenize", **openapi.TOKENIZE)
async def tokenize(request: Request, plane: DataPlane) -> Response:
    """Each text's token ids and tokens, as the model runs them."""
    require_json(request)
    payload = await plane.infer(codec.TokenizeCodec(), read_body(request, plane.settings))
    return Response(payload, media_type="application/json")
