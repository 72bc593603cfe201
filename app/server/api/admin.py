"""The admin token of the repository, trace and logging routes (HTTP and gRPC alike)."""

from __future__ import annotations

import hmac

from app.errors import Forbidden, Unauthorized
from app.settings import Settings

SCHEME = "bearer"


def check_token(authorization: str | None, settings: Settings) -> None:
    """Nothing when no token is set or the header carries it; 401 without a bearer token, 403 with a wrong one."""
    expected = settings.admin_token
    if not expected:
        return
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != SCHEME or not token.strip():
        raise Unauthorized("expected `Authorization: Bearer <token>` (NORMSERVE_ADMIN_TOKEN is set)", "authorization")
    # Constant time: how long a wrong guess takes must not tell how much of it was right.
    if not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise Forbidden("wrong admin token", "authorization")
