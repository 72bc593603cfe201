"""The gRPC server of one worker: grpcio's asyncio server on the app's event loop, started and stopped by the lifespan.

It listens on NORMSERVE_HOST:NORMSERVE_GRPC_PORT (8001; 0 = off) in every worker process. Several
workers share the port through SO_REUSEPORT (grpc's default on Linux, set here explicitly): each
worker binds its own listening socket and the kernel spreads new connections across them, as
uvicorn's shared socket does for HTTP. The same option would let a second server bind the port too,
so each worker first claims the port for its server (app/server/group.py): a worker of another
server refuses to start, naming the port and the settings, and that server exits.

Handlers are registered from the service descriptors that tritonclient's generated modules carry,
so every RPC of `inference.GRPCInferenceService` is routed: the implemented ones to
app/server/api/v2/grpc/service.py (trace and log settings: control.py; shared memory: UNIMPLEMENTED naming the
extension), any other to UNIMPLEMENTED. Server reflection (grpc.reflection.v1alpha, the one grpcio-reflection has)
describes both services, so that `grpcurl list` and `grpcurl describe` work without the .proto files.
ModelInfer and ModelStreamInfer get wire.py's serializers, which append raw outputs without copies.
Messages larger than NORMSERVE_MAX_BODY_BYTES, also after decompression, are refused by grpc itself
with RESOURCE_EXHAUSTED before any handler runs. A connection that completes no handshake within
NORMSERVE_HEADER_TIMEOUT_S is closed, as is one idle for IDLE_MS; connections are limited as HTTP's are
(app/server/admission.py), streams per connection and RPCs at once too, which bounds the messages grpc
buffers before the budget of body bytes in flight counts them (app/server/budget.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from types import ModuleType
from typing import IO, Any

import grpc
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection
from tritonclient.grpc import service_pb2 as pb

from app.server import group
from app.server.admission import connection_limit
from app.server.api.v2.grpc import calls, health, service, wire
from app.server.budget import Budget
from app.server.worker import Worker
from app.settings import Settings

log = logging.getLogger("normserve.lifecycle")
MIN_GRACE_S = 1.0
IDLE_MS = 300_000  # a connection with no RPC for 5 minutes gets GOAWAY; clients reconnect when they need to
# RPCs at once on one connection (HTTP/2 advises no fewer): at 16, a client at concurrency 16 had streams refused
# (RST_STREAM 7, tests/suites/test_grpc_load.py); the budget, not this, bounds the messages held.
MAX_STREAMS = 100
RPC_HEADROOM = 16  # RPCs at once beyond NORMSERVE_MAX_IN_FLIGHT: health checks, streams
SERIALIZERS: dict[str, Callable[[Any], bytes]] = {
    "ModelInfer": wire.serialize_infer,
    "ModelStreamInfer": wire.serialize_stream,
}
GATED = {"ModelInfer"}  # read only once the budget has room (calls.gated); a stream's messages count as they come
PARSERS: dict[str, Callable[[bytes], Any]] = {"ModelInfer": wire.parse_infer, "ModelStreamInfer": wire.parse_infer}


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def options(settings: Settings) -> list[tuple[str, int]]:
    return [
        ("grpc.so_reuseport", 1),  # every worker binds the port (module docstring)
        ("grpc.max_receive_message_length", settings.max_body_bytes),  # decompressed too
        ("grpc.max_send_message_length", -1),  # answers are bounded by the inputs' limits, as over HTTP
        # Connections that sent nothing, or never an RPC, were never closed (issue 22): as HTTP's head deadline.
        ("grpc.server_handshake_timeout_ms", int(settings.header_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", IDLE_MS),
        ("grpc.max_allowed_incoming_connections", connection_limit(settings)),
        # Messages grpc buffers before a handler can count them in NORMSERVE_MAX_INFLIGHT_BYTES (budget.py).
        ("grpc.max_concurrent_streams", MAX_STREAMS),
        # grpc grows each stream's flow-control window to the link's bandwidth-delay product: on loopback,
        # calls waiting for room in the budget had megabytes each buffered beyond it (32 concurrent 61 MiB
        # calls at NORMSERVE_MAX_IN_FLIGHT=2: +1,108-1,625 MiB with it, +891-957 without; one such call took
        # 0.7-1.0 s either way, scripts/peak_memory.py).
        ("grpc.http2.bdp_probe", 0),
    ]


async def _unimplemented(request: Any, context: Any, call: calls.Call) -> Any:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"normserve does not implement {call.method}")


def handlers(
    descriptor: Any, messages: ModuleType, impl: object, settings: Settings | None = None, budget: Budget | None = None
) -> dict[str, grpc.RpcMethodHandler]:
    """A handler for every RPC of a service descriptor, wrapped by calls.py; UNIMPLEMENTED where impl has none.
    With a budget, ModelInfer reads its message only once NORMSERVE_MAX_BODY_BYTES fit in it (calls.gated)."""
    table: dict[str, grpc.RpcMethodHandler] = {}
    for method in descriptor.methods:
        request_type = getattr(messages, method.input_type.name)
        response_type = getattr(messages, method.output_type.name)
        fn: Any = getattr(impl, method.name, _unimplemented)
        kw = {
            "request_deserializer": calls.decoder(request_type, PARSERS.get(method.name)),
            "response_serializer": SERIALIZERS.get(method.name, response_type.SerializeToString),
        }
        name = descriptor.full_name
        if method.name in GATED and budget is not None and settings is not None:
            unary = calls.unary(name, method.name, fn)
            gate = calls.gated(budget, settings.max_body_bytes, settings.body_timeout_s, unary)
            table[method.name] = grpc.stream_unary_rpc_method_handler(gate, **kw)
        elif not method.server_streaming:
            table[method.name] = grpc.unary_unary_rpc_method_handler(calls.unary(name, method.name, fn), **kw)
        elif method.client_streaming:  # ModelStreamInfer: each message is counted as its own call (service.py)
            wrapped = calls.streaming(name, method.name, fn, count=False)
            table[method.name] = grpc.stream_stream_rpc_method_handler(wrapped, **kw)
        else:  # Health.Watch: counted once per stream
            table[method.name] = grpc.unary_stream_rpc_method_handler(calls.streaming(name, method.name, fn), **kw)
    return table


def _register(server: grpc.aio.Server, name: str, table: Mapping[str, grpc.RpcMethodHandler]) -> None:
    # As the generated add_*_to_server functions do: generic handlers, and registered ones where grpcio has them.
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, table),))
    if hasattr(server, "add_registered_method_handlers"):
        server.add_registered_method_handlers(name, table)


def build(worker: Worker) -> tuple[grpc.aio.Server, service.InferenceService, health.HealthService]:
    inference, checks = service.InferenceService(worker), health.HealthService(worker.admission)
    settings = worker.settings
    # Past the in-flight limit RPCs are refused anyway; the headroom keeps health checks and streams answered.
    limit = settings.max_in_flight + RPC_HEADROOM
    server = grpc.aio.server(options=options(settings), maximum_concurrent_rpcs=limit)
    inference_service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    table = handlers(inference_service, pb, inference, settings, worker.budget)
    _register(server, inference_service.full_name, table)
    health_service = health_pb2.DESCRIPTOR.services_by_name["Health"]
    _register(server, health_service.full_name, handlers(health_service, health_pb2, checks))
    names = (inference_service.full_name, health_service.full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)  # the descriptors of tritonclient's and grpc's modules
    return server, inference, checks


def grace_s(worker: Worker) -> float:
    """What is left of the drain timeout (all of it without a SIGTERM), at least MIN_GRACE_S."""
    spent = 0.0 if worker.drain.signalled_at is None else time.monotonic() - worker.drain.signalled_at
    return max(MIN_GRACE_S, worker.settings.drain_timeout_s - spent)


def _listen(server: grpc.aio.Server, where: str, port: int) -> IO[str]:
    """Claim the port for this server, then bind it: PortTaken (logged) when either fails, and the worker does not
    start half-served (uvicorn ends the server)."""
    try:
        claim = group.claim_grpc_port(port)
    except group.PortTaken as e:
        log.error("%s", e, extra={"grpc_address": where})  # the one line to read among uvicorn's traceback
        raise
    try:
        server.add_insecure_port(where)
    except RuntimeError:  # held by a process that is no normserve, or not an address of this host
        claim.close()
        error = group.PortTaken(
            f"cannot listen for gRPC on {where} (in use, or not an address of this host); "
            f"choose another with {group.ENV_HINT}"
        )
        log.error("%s", error, extra={"grpc_address": where})
        raise error from None
    return claim


@asynccontextmanager
async def serving(worker: Worker) -> AsyncIterator[grpc.aio.Server | None]:
    """Serve gRPC for the lifespan's duration (nothing when NORMSERVE_GRPC_PORT is 0); a port in use fails start-up."""
    settings = worker.settings
    if settings.grpc_port == 0:
        yield None
        return
    server, inference, checks = build(worker)
    where = address(settings.host, settings.grpc_port)
    claim = _listen(server, where, settings.grpc_port)
    await server.start()
    log.info("gRPC listening on %s", where, extra={"grpc_address": where})
    try:
        yield server
    finally:
        claim.close()
        # The drain (SIGTERM) has already waited for in-flight inferences; mark draining in case no signal came,
        # so that RPCs arriving during the grace answer UNAVAILABLE, then end idle streams and stop.
        worker.admission.draining = True
        inference.close()
        checks.close()
        await server.stop(grace_s(worker))
