"""grpc.health.v1.Health: SERVING when the worker accepts work, NOT_SERVING otherwise; live and in process."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from app.server.admission import Admission
from app.server.api.v2.grpc.calls import Call
from app.server.api.v2.grpc.health import HealthService
from tests.server.api.v2.grpc.live import GrpcServer

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


@pytest.fixture(scope="module")
def stub(live_grpc: GrpcServer) -> Any:
    with grpc.insecure_channel(live_grpc.address) as channel:
        yield health_pb2_grpc.HealthStub(channel)


@pytest.mark.parametrize("service", ["", "inference.GRPCInferenceService"], ids=["server", "inference"])
def test_a_ready_server_is_serving(stub: Any, service: str) -> None:
    assert stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == SERVING


def test_an_unknown_service_is_not_found(stub: Any) -> None:
    with pytest.raises(grpc.RpcError) as e:
        stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details() == "unknown service 'nope'; known: '', 'inference.GRPCInferenceService'"


@pytest.mark.parametrize(("service", "status"), [("", SERVING), ("nope", UNKNOWN)], ids=["server", "unknown"])
def test_watch_sends_the_status_at_once(stub: Any, service: str, status: int) -> None:
    stream = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=10)
    assert next(stream).status == status
    stream.cancel()


@pytest.mark.parametrize(
    ("ready", "draining", "status"),
    [(True, False, SERVING), (False, False, NOT_SERVING), (True, True, NOT_SERVING)],
    ids=["ready", "loading", "draining"],
)
def test_the_status_follows_admission(ready: bool, draining: bool, status: int) -> None:
    admission = Admission(4)
    admission.ready, admission.draining = ready, draining
    health = HealthService(admission)
    assert health.status("") == health.status("inference.GRPCInferenceService") == status
    assert health.status("other") == UNKNOWN


def test_watch_sends_each_change_and_ends_on_close() -> None:
    admission = Admission(4)
    health = HealthService(admission)
    request = health_pb2.HealthCheckRequest(service="")

    async def watch() -> list[int]:
        seen: list[int] = []

        async def flip() -> None:
            await asyncio.sleep(0.15)
            admission.ready = True
            await asyncio.sleep(0.15)
            admission.draining = True
            await asyncio.sleep(0.15)
            health.close()

        flipper = asyncio.ensure_future(flip())
        async for response in health.Watch(request, None, Call("h", "Watch", "id")):
            seen.append(response.status)
        await flipper
        return seen

    assert asyncio.run(asyncio.wait_for(watch(), 5)) == [NOT_SERVING, SERVING, NOT_SERVING]
