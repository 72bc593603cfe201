"""OpenAPI for the raw-body routes: what every protocol's documents share, and the app's assembly.

The routes read raw bodies (no pydantic on the hot path), so FastAPI cannot infer their documents: each
route's dict says what it takes and every status it may answer, beside its routes (app/server/api/rest/
openapi.py, app/server/api/v2/http/openapi.py); the V2 bodies are the protocol's (app/server/api/v2/
schemas.py). tests/suites/test_fuzz.py fuzzes a live server from this document.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from app.server.api.v2.schemas import COMPONENTS, ref

ERROR = {"content": {"application/json": {"schema": ref("error")}}}


_MEANING = {
    400: "body is not valid JSON",
    401: "no `Authorization: Bearer <token>`, or more than one, while NORMSERVE_ADMIN_TOKEN is set",
    403: "NORMSERVE_ADMIN_TOKEN not set (admin routes closed), a wrong admin token, or model control that is not "
    "explicit (the message names the setting)",
    404: "unknown model or version",
    408: "the body did not arrive within NORMSERVE_BODY_TIMEOUT_S; the connection is closed",
    413: "body larger than NORMSERVE_MAX_BODY_BYTES, also after decompression",
    415: "Content-Type is not JSON, or Content-Encoding is neither gzip nor deflate",
    422: "invalid tensor or field; the message names the field",
    503: "not ready, draining, or over NORMSERVE_MAX_IN_FLIGHT",
    504: "inference took longer than NORMSERVE_REQUEST_TIMEOUT_S",
}
# V2 answers 400 where REST answers 422, as Triton does; its bodies are read whatever their Content-Type.
_V2_MEANING = {
    **_MEANING,
    400: "invalid body, tensor, parameter, header, model name or version; the message names the field",
    415: "Content-Encoding is neither gzip nor deflate",
}
RETRY_AFTER = {"Retry-After": {"required": True, "description": "seconds", "schema": {"type": "integer"}}}


def errors(*statuses: int, v2: bool = False) -> dict[int | str, dict[str, Any]]:
    meaning = _V2_MEANING if v2 else _MEANING
    return {s: {"description": meaning[s], **ERROR, **({"headers": RETRY_AFTER} if s == 503 else {})} for s in statuses}


def ok(description: str, schema: str) -> dict[int | str, dict[str, Any]]:
    return {200: {"description": description, "content": {"application/json": {"schema": ref(schema)}}}}


HEALTH_LIVE: dict[str, Any] = {"responses": ok("the process serves", "v2_liveness")}
HEALTH_READY: dict[str, Any] = {
    "responses": {
        **ok("every model verified, and not draining", "v2_readiness"),
        503: {"description": "models not verified yet, or draining: the reason", **ERROR, "headers": RETRY_AFTER},
    }
}


def install(app: FastAPI) -> None:
    """The app's document as FastAPI builds it, plus the protocol's schemas, less the 422 FastAPI adds itself.

    FastAPI documents a `{"detail": ...}` 422 on every route with parameters; no route answers it
    (DirectRoute validates nothing, and app/server/http/errors.py answers `{"error": ...}`)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        fresh = app.openapi_schema is None
        doc = build()  # FastAPI's, built once and then cached in app.openapi_schema
        if fresh:
            _amend(doc)
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def _amend(doc: dict[str, Any]) -> None:
    for item in doc["paths"].values():
        for operation in item.values():
            if "HTTPValidationError" in str(operation.get("responses", {}).get("422")):
                del operation["responses"]["422"]
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    components.update(COMPONENTS)
