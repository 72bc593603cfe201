"""Domain errors: what went wrong and which field, knowing nothing of HTTP.

    NormserveError
    ├── InvalidInput (ValueError)        bad values, shapes or fields      422 REST / 400 V2
    │   └── MalformedBody                not JSON, or not the declared binary layout   400
    ├── PayloadTooLarge                  over max_body_bytes                413
    ├── UnsupportedMediaType             Content-Type not application/json  415
    ├── BodyTimeout                      body not in full in body_timeout_s 408, and the connection closed
    ├── ModelNotFound (LookupError)      unknown model or version           404
    ├── ModelControlDisabled             repository load/unload: no explicit model control   403
    ├── Unauthorized                     admin route without the bearer token   401
    ├── Forbidden                        admin route: wrong token, or none configured   403
    ├── ModelLoadFailed                  a load through the repository API failed   400
    ├── ExtensionNotSupported            a Triton extension normserve has not (shared memory)   400, gRPC UNIMPLEMENTED
    ├── Overloaded                       over max_in_flight                 503 + Retry-After
    │   └── BudgetExhausted              over max_inflight_bytes            503 + Retry-After (RESOURCE_EXHAUSTED)
    ├── NotReady                         models not verified, or draining   503 + Retry-After
    └── Timeout (TimeoutError)           past request_timeout_s             504

The one table mapping them to HTTP statuses is `status_for` below; app/server/http/errors.py uses it,
and app/server/api/v2/grpc/calls.py maps those statuses on to gRPC status codes.
"""

from __future__ import annotations

import reprlib


class NormserveError(Exception):
    """Base: a message for the client that names the offending field."""

    def __init__(self, message: str, field: str | None = None) -> None:
        self.field = field
        self.message = f"{field}: {message}" if field else message
        super().__init__(self.message)


class InvalidInput(NormserveError, ValueError):
    """A request that parses but whose values, shapes or fields are wrong."""


class MalformedBody(InvalidInput):
    """A body that is not valid JSON, or not the binary layout its header declares."""


class PayloadTooLarge(NormserveError):
    """A body (or its decompressed form) over the configured limit."""


class UnsupportedMediaType(NormserveError):
    """A Content-Type that is not JSON."""


class BodyTimeout(NormserveError):
    """A request body that did not arrive in time: a slow client must not hold its socket for ever."""


class ModelNotFound(NormserveError, LookupError):
    """An unknown model name or version."""


class ModelControlDisabled(NormserveError):
    """A request to load or unload a model: the models are fixed at start-up (no explicit model control)."""


class Unauthorized(NormserveError):
    """An admin route (repository, trace, logging) without `Authorization: Bearer <token>` when a token is set."""


class Forbidden(NormserveError):
    """An admin route with a token that is not NORMSERVE_ADMIN_TOKEN, or with none configured (closed)."""


class ModelLoadFailed(NormserveError):
    """A model version that failed to load (sha256, session, parity): what serves stays as it was."""


class ExtensionNotSupported(NormserveError):
    """A route or RPC of a Triton extension normserve does not implement: the message names the extension.

    HTTP answers 400, as Triton answers a request it cannot serve; gRPC has a code of its own for it, UNIMPLEMENTED
    (app/server/api/v2/grpc/calls.py)."""

    def __init__(self, extension: str) -> None:
        super().__init__(
            f"the {extension} extension is not supported: normserve reads every tensor from the request itself "
            "(binary data over HTTP, raw_input_contents over gRPC)"
        )
        self.extension = extension


class Overloaded(NormserveError):
    """More requests in flight than the worker allows."""


class BudgetExhausted(Overloaded):
    """More request body bytes in flight than the worker allows (gRPC answers it RESOURCE_EXHAUSTED)."""


class NotReady(NormserveError):
    """Models not loaded and verified yet, or the worker is draining."""


class Timeout(NormserveError, TimeoutError):
    """The inference took longer than the request timeout."""


# (REST status, V2 status); the most specific class wins because the lookup walks the MRO.
_STATUS: dict[type[NormserveError], tuple[int, int]] = {
    MalformedBody: (400, 400),
    InvalidInput: (422, 400),
    PayloadTooLarge: (413, 413),
    UnsupportedMediaType: (415, 415),
    BodyTimeout: (408, 408),
    ModelNotFound: (404, 404),
    ModelControlDisabled: (403, 403),
    Unauthorized: (401, 401),
    Forbidden: (403, 403),
    ModelLoadFailed: (400, 400),
    ExtensionNotSupported: (400, 400),
    Overloaded: (503, 503),
    NotReady: (503, 503),
    Timeout: (504, 504),
    NormserveError: (500, 500),
}

RETRY_AFTER_S = 1
MESSAGE_LIMIT = 1000  # characters of an error message; longer ones (a huge field name echoed) are cut

# Plain repr recurses once per level: a JSON array nested 1,000 deep (orjson parses up to 1,024) went past
# Python's recursion limit inside an error message, a 500; and it copies a 64 MiB value whole before the
# message is cut to 1,000 characters. reprlib bounds both (and lists a dict's keys sorted).
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel = 4
_SHOWN.maxlist = _SHOWN.maxdict = 16
_SHOWN.maxstring = _SHOWN.maxother = _SHOWN.maxlong = 120


def shown(value: object) -> str:
    """A client's value quoted in an error message: its repr, bounded in depth and length."""
    return _SHOWN.repr(value)


def printable(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """Messages echo client text (field names, values): escape what is not printable, and bound the length."""
    if not message.isprintable():
        # Control, bidi and zero-width characters could disguise the message in a terminal or a log viewer.
        message = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in message)
    return message if len(message) <= limit else message[: limit - 1] + "…"


def status_for(exc: NormserveError, v2: bool) -> int:
    """The HTTP status of a domain error, for the REST endpoints or the V2 protocol."""
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls][1 if v2 else 0]
    return 500
