"""POST /normalize and POST /encode: JSON in, JSON out; thin routes around the REST codec and the Worker."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from app.core.dataplane import EncodeInput, NormalizeInput, NormalizeOutput
from app.core.model import Model
from app.server import observability
from app.server.api import openapi
from app.server.api.body import read_body, require_json
from app.server.api.direct import DirectRoute, hot
from app.server.api.rest import codec
from app.server.statistics import InferTimer
from app.server.worker import INLINE_BODY_BYTES, Worker, staged

router = APIRouter(tags=["normalization"], route_class=DirectRoute)  # no per-request dependency solving


@router.post("/normalize", **openapi.NORMALIZE)
@hot
async def normalize(request: Request, worker: Worker) -> Response:
    """Layer-normalize `data` over its trailing `normalized_shape` dims, with per-row statistics."""
    require_json(request)
    body = await read_body(request, worker.settings)
    inline = len(body) <= INLINE_BODY_BYTES
    # The body goes once decoded: a 64 MiB request's answer was built while it was still held, 133 MiB
    # above the worker's RSS with the body in at the encode stage, 69 MiB without (in process, /proc VmHWM).
    held = [body]
    del body
    timer = InferTimer()

    def decode() -> tuple[Model, NormalizeInput, None]:
        model, req = codec.decode_normalize(held.pop(), worker.settings, _resolver(worker, timer))
        return model, req, None

    def encode(_: None, out: NormalizeOutput) -> bytes:
        if out.model is not None:
            observability.note_model(out.model.name)
        return codec.encode_normalize(out)

    job = staged(timer, decode, encode)
    payload = await worker.infer(timer, job, inline=inline)
    return Response(payload, media_type="application/json")


@router.post("/encode", **openapi.ENCODE)
@hot
async def encode(request: Request, worker: Worker) -> Response:
    """Run the Transformer encoder; report each LayerNorm's input statistics per position."""
    require_json(request)
    body = await read_body(request, worker.settings)
    # Never inline what a batcher may hold: it blocks its caller while the batch gathers.
    inline = len(body) <= INLINE_BODY_BYTES and worker.settings.batch_max_size <= 1
    held = [body]  # released once decoded, as in normalize
    del body
    timer = InferTimer()

    def decode() -> tuple[Model, EncodeInput, bool]:
        # bool: answer [seq, d_model] without batch
        return codec.decode_encode(held.pop(), worker.settings, _resolver(worker, timer))

    job = staged(timer, decode, codec.encode_encode)
    payload = await worker.infer(timer, job, inline=inline)
    return Response(payload, media_type="application/json")


def _resolver(worker: Worker, timer: InferTimer) -> codec.Resolve:
    """The serving model a body names (`model`, `version`); the request, even one that then fails to decode,
    counts in that model's statistics."""

    def resolve(name: str, version: int | str | None) -> Model:
        model = worker.model(name, version)
        timer.model = (model.name, model.version)
        return model

    return resolve
