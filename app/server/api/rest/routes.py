"""POST /normalize and POST /encode: JSON in, JSON out; the data plane does the work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from app.core import dataplane
from app.core.tensors import dumps, encode_json_tensor
from app.server.api import openapi as docs
from app.server.api.body import read_body, require_json
from app.server.api.direct import DirectRoute
from app.server.api.rest.codec import parse_encode, parse_normalize
from app.server.worker import INLINE_BODY_BYTES, State, StateDep, run_inference

router = APIRouter(tags=["normalization"], route_class=DirectRoute)  # no per-request dependency solving


@router.post("/normalize", **docs.NORMALIZE)
async def normalize(request: Request, state: StateDep) -> Response:
    """Layer-normalize `data` over its trailing `normalized_shape` dims, with per-row statistics."""
    return await _json_call(request, state, _normalize, may_batch=False)


@router.post("/encode", **docs.ENCODE)
async def encode(request: Request, state: StateDep) -> Response:
    """Run the Transformer encoder; report each LayerNorm's input statistics per position."""
    return await _json_call(request, state, _encode, may_batch=state.settings.batch_max_size > 1)


async def _json_call(
    request: Request, state: State, handle: Callable[[bytearray, State], bytes], may_batch: bool
) -> Response:
    """Read the body on the event loop; parse, compute and serialize in the threadpool (tiny bodies inline)."""
    require_json(request)
    body = await read_body(request, state.settings.max_body_bytes)
    # Never inline what a batcher may hold: it blocks its caller while the batch gathers.
    inline = len(body) <= INLINE_BODY_BYTES and not may_batch
    payload = await run_inference(state, lambda: handle(body, state), inline=inline)
    return Response(payload, media_type="application/json")


def _normalize(body: bytearray, state: State) -> bytes:
    req = parse_normalize(body, state.settings)
    out = dataplane.normalize(state.runtime, req)
    doc: dict[str, Any] = {
        "output": encode_json_tensor(out.output),
        "shape": list(req.x.shape),
        "stats": {
            "mean": encode_json_tensor(out.mean),
            "var": encode_json_tensor(out.var),
            "std": encode_json_tensor(np.sqrt(out.var)),
        },
        "backend": out.backend,
        "model": out.model.describe() if out.model else None,
    }
    if out.validation is not None:
        doc["validation"] = out.validation
    return dumps(doc)


def _encode(body: bytearray, state: State) -> bytes:
    req, squeeze = parse_encode(body, state.settings)
    out = dataplane.encode(state.runtime, req)

    def shaped(a: np.ndarray) -> Any:
        return encode_json_tensor(a[0] if squeeze else a)

    doc: dict[str, Any] = {
        "output": shaped(out.output),
        "shape": list(out.output.shape[1:] if squeeze else out.output.shape),
        "layer_norms": [{"name": n, "mean": shaped(m), "std": shaped(s)} for n, m, s in out.layer_norms],
        "model": out.model.describe(),
    }
    if out.validation is not None:
        doc["validation"] = out.validation
    return dumps(doc)
