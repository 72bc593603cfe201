"""The CLI's one HTTP call to a running server: JSON in and out, the server's own error message on failure."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import orjson

TIMEOUT_S = 60.0


class RequestFailed(RuntimeError):
    """An unreachable server, an error status (with the server's message) or an answer that is not JSON."""

    def __init__(self, message: str, request: str, status: int | None = None, unreachable: bool = False) -> None:
        super().__init__(message)
        self.request = request  # "POST http://..."
        self.status = status  # the HTTP status the server answered, if it answered one
        self.unreachable = unreachable  # no connection: the address may be the wrong one


def call(method: str, url: str, doc: Any = None, token: str | None = None, timeout: float = TIMEOUT_S) -> Any:
    """One JSON request; RequestFailed naming the method, URL and the server's `error` on any failure."""
    data = None if doc is None else orjson.dumps(doc)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    request = f"{method} {url}"
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return orjson.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise RequestFailed(f"{request}: HTTP {e.code}: {error_of(e.read())}", request, e.code) from None
    except urllib.error.URLError as e:
        raise RequestFailed(f"cannot reach {url}: {e.reason}", request, unreachable=True) from None
    except (OSError, orjson.JSONDecodeError) as e:
        raise RequestFailed(f"{request}: {e}", request) from None


def error_of(body: bytes) -> str:
    try:
        return str(orjson.loads(body)["error"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace") or "no body"
