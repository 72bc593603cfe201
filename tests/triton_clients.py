"""tritonclient on a live server, over HTTP or gRPC: the one way the tests open one (tests/conftest.py's `triton`).

A test module whose tests take `triton` on another server than the shared live_grpc names it in a module-level
`TRITON = TritonOn(server fixture, "http" | "grpc", client options)`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from tests.server.api.v2.grpc.live import GrpcServer

Kind = Literal["http", "grpc"]


@dataclass(frozen=True)
class TritonOn:
    server: str = "live_grpc"  # the fixture of the live server: a base URL (http) or a GrpcServer (either)
    kind: Kind = "grpc"
    options: Mapping[str, Any] = field(default_factory=dict)  # the client's own, e.g. network_timeout


@contextmanager
def triton_client(server: str | GrpcServer, kind: Kind, **options: Any) -> Iterator[Any]:
    """tritonclient.grpc on a GrpcServer's gRPC port, or tritonclient.http on its (or a base URL's) HTTP port;
    imported here, so that tests that never ask for one need not load grpc."""
    if kind == "grpc":
        import tritonclient.grpc as tg

        assert isinstance(server, GrpcServer), f"tritonclient.grpc needs a server with gRPC on, not {server!r}"
        client: Any = tg.InferenceServerClient(server.address, **options)
    else:
        import tritonclient.http as th

        base = server.base if isinstance(server, GrpcServer) else server
        client = th.InferenceServerClient(base.removeprefix("http://"), **options)
    try:
        yield client
    finally:
        client.close()
