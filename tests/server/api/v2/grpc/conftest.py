"""One live server with gRPC on, shared by the gRPC tests, and tritonclient.grpc on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.grpc as tg

from tests.server.api.v2.grpc.live import ADMIN_TOKEN, GrpcServer, grpc_server


@pytest.fixture(scope="session")
def live_grpc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    with grpc_server(tmp_path_factory.mktemp("grpc"), {"NORMSERVE_ADMIN_TOKEN": ADMIN_TOKEN}) as server:
        yield server


@pytest.fixture(scope="session")
def triton(live_grpc: GrpcServer) -> Iterator[tg.InferenceServerClient]:
    client = tg.InferenceServerClient(live_grpc.address)
    yield client
    client.close()
