"""The admin token of the repository, trace and logging routes (HTTP and gRPC): closed without one, constant time.

An admin route can unload every model or turn every log line off, so with NORMSERVE_ADMIN_TOKEN unset
they are closed (403 naming the setting), never open. The configured token is checked at start
(app/settings.py: stripped, printable ASCII). A request carries it once: two `authorization` values
(headers or gRPC metadata) are refused whatever they hold, as proxies and servers disagree on which wins.
"""

from __future__ import annotations

import hmac
import string
from collections.abc import Sequence
from typing import Any

from app.errors import Forbidden, Unauthorized
from app.settings import Settings

SCHEME = "bearer"
FIELD = "authorization"
CLOSED = "the admin routes are closed: set NORMSERVE_ADMIN_TOKEN on the server to open them"
MISSING = "expected `Authorization: Bearer <token>` (NORMSERVE_ADMIN_TOKEN is set)"
# Only ASCII whitespace surrounds the token: str.strip() would also drop a no-break space or NEL (the header is
# read as Latin-1), so a value an exact-match filter in front of the server sees as different would pass.
WHITESPACE = string.whitespace


def check_token(values: Sequence[str], settings: Settings, action: str | None = None) -> None:
    """Nothing when the one `authorization` value carries the token: 403 when no token is set or it is wrong,
    401 without a bearer token or with more than one `authorization` value. action: the load or unload asked."""
    expected = settings.admin_token
    if not expected:
        raise Forbidden(closed(settings, action), FIELD)
    if len(values) > 1:
        raise Unauthorized(f"{len(values)} authorization values; {MISSING}", FIELD)
    scheme, _, token = (values[0] if values else "").strip(WHITESPACE).partition(" ")
    token = token.strip(WHITESPACE)
    if scheme.lower() != SCHEME or not token:
        raise Unauthorized(MISSING, FIELD)
    # Constant time: how long a wrong guess takes must not tell how much of it was right.
    if not hmac.compare_digest(token.encode(), expected.encode()):
        raise Forbidden("wrong admin token", FIELD)


def closed(settings: Settings, action: str | None) -> str:
    """Why a closed admin route refuses: a load or unload outside explicit mode would be refused by the mode next,
    so both settings are named at once rather than one after the other."""
    mode = settings.model_control
    if action is None or mode == "explicit":
        return CLOSED
    return f"{CLOSED}; to {action} models, NORMSERVE_MODEL_CONTROL=explicit as well (it is {mode!r})"


def grpc_values(context: Any) -> list[str]:
    """Every `authorization` value of a gRPC call's metadata (binary values are no token: refused as absent)."""
    metadata = context.invocation_metadata() or ()
    return [m.value if isinstance(m.value, str) else "" for m in metadata if m.key == FIELD]
