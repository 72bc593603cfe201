"""The one place errors become HTTP answers: {"error": "<field>: <what was expected>"} with the mapped status."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from app.errors import RETRY_AFTER_S, NormserveError, printable, status_for
from app.server.api.openai import codec as openai_codec
from app.server.http.responses import json_response
from app.server.telemetry import observability

log = logging.getLogger("normserve.errors")


def is_v2(request: Request) -> bool:
    return request.url.path.startswith("/v2")


def is_openai(request: Request) -> bool:
    """OpenAI's routes (and /tokenize beside them): errors in OpenAI's shape, bad input a 400 as on V2."""
    path = request.url.path
    return path.startswith("/v1/") or path == "/tokenize"


def body(request: Request, message: str, status: int, field: str | None = None) -> dict[str, Any]:
    """The error's JSON: {"error": message}, or OpenAI's {"error": {"message", "type", "param", "code"}}."""
    message = printable(message)
    return openai_codec.error_body(message, field, status) if is_openai(request) else {"error": message}


def error_response(request: Request, exc: NormserveError) -> Response:
    status = status_for(exc, is_v2(request) or is_openai(request))
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    if status == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="normserve"'}  # RFC 6750: the scheme the route expects
    return json_response(body(request, exc.message, status, exc.field), status_code=status, headers=headers)


async def _domain(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, NormserveError)
    return error_response(request, exc)


async def _validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    field = ".".join(str(p) for p in first["loc"] if p not in ("body", "query", "path"))
    status = 400 if is_v2(request) or is_openai(request) else 422
    return json_response(body(request, f"{field or 'request'}: {first['msg']}", status, field), status_code=status)


async def _http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    message = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
    return json_response(body(request, message, exc.status_code), status_code=exc.status_code, headers=exc.headers)


async def unexpected(request: Request, exc: Exception) -> Response:
    # Never a traceback or an internal path to the client; the log has them.
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    # Sent from outside the observability middleware (by Starlette's ServerErrorMiddleware): add the id here.
    rid = observability.request_id(request.scope)
    # uvicorn closes the connection after an error it sees raised: say so, or the client's next request fails.
    headers = {"Connection": "close", **({observability.HEADER: rid} if rid else {})}
    return json_response({"error": "internal error"}, 500, headers=headers)


def install(app: FastAPI) -> None:
    app.add_exception_handler(NormserveError, _domain)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, unexpected)
