"""The reaches into a framework's internals that remain, all in this module, each pinned by a test
(tests/server/test_compat.py) that fails when a new release of the framework moves what it reads.

pyproject.toml bounds uvicorn, fastapi, onnxruntime and grpcio above; raising a bound runs those tests first.

- uvicorn's `Server`, found as the object whose bound method is the SIGTERM handler uvicorn installed
  (`Server.capture_signals`, 0.54). `normserve serve` needs it for nothing but the drain's shutdown bound: it hands
  uvicorn's Config the guarded protocol (`http=`) and the drain timeout (`timeout_graceful_shutdown`) through
  their public parameters (app/cli/serve.py). For a bare `uvicorn app.main:app` it is the documented fallback:
  the lifespan guards the protocol of the Config found here (app/server/http/heads.py `install`).
- The attributes of uvicorn's HTTP protocols that `HeadGuard` (app/server/http/heads.py) reads, and of their
  request cycle: PROTOCOL_ATTRIBUTES and CYCLE_ATTRIBUTES below, checked on both of uvicorn's parsers.
"""

from __future__ import annotations

from typing import Any

# Set by uvicorn's HttpToolsProtocol and H11Protocol (__init__ or connection_made), read by HeadGuard.
PROTOCOL_ATTRIBUTES = ("transport", "connections", "cycle", "loop")
# Of uvicorn's RequestResponseCycle: whether the request's body is still arriving, and its answer sent.
CYCLE_ATTRIBUTES = ("more_body", "response_complete")


def signal_server(handler: Any) -> Any | None:
    """The uvicorn Server whose handler `handler` is (a bound method of it), or None for any other handler."""
    server = getattr(handler, "__self__", None)
    return server if hasattr(server, "config") else None


def server_config(handlers: Any) -> Any | None:
    """The Config of the uvicorn Server behind the first of these signal handlers that is one of its methods."""
    servers = (signal_server(handler) for handler in handlers)
    return next((server.config for server in servers if server is not None), None)


def bound_graceful_shutdown(handler: Any, remaining_s: float) -> None:
    """At most remaining_s for the shutdown of the Server behind `handler` to wait for open connections.

    uvicorn's `Server.shutdown` waits `config.timeout_graceful_shutdown` (None = for ever); it reads the value
    when shutdown starts, so setting it before the handler runs takes effect."""
    server = signal_server(handler)
    config = getattr(server, "config", None)
    if config is None or not hasattr(config, "timeout_graceful_shutdown"):
        return
    current = config.timeout_graceful_shutdown
    if current is None or current > remaining_s:
        config.timeout_graceful_shutdown = remaining_s
