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
with RESOURCE_EXHAUSTED and its own text ("Received message larger than max (N vs. M)") before any handler
reads them: grpc checks the length a message announces before it buffers the message (a 300 MB one to a
1 MB limit: +1 MB of server RSS; with no limit, +927 MB), so the limit stays grpc's and its text with it.
ModelInfer's handler records such a call as the client saw it (calls.gated).
A connection that completes no handshake (the client's preface and SETTINGS) within NORMSERVE_HEADER_TIMEOUT_S is
closed, and one without an RPC for as long gets GOAWAY and is closed (as HTTP closes a connection idle between
requests); connections are limited as HTTP's are (app/server/admission.py), and RPCs per connection (MAX_STREAMS).
No limit of RPCs at once is set, so no health check is refused for want of one; ModelInfer reads its message, and a
stream each of its messages, only once the budget of body bytes in flight holds room for it (app/server/budget.py).

No RPC limit keeps a probe out, but the connection limit can keep it from connecting: past it grpc refuses the
new connection, and clients that reconnect as fast as theirs close keep it full (1,200 that sent only the preface:
3 of 20 probes answered, issue 37 D7). With NORMSERVE_GRPC_HEALTH_PORT, each worker also runs a small server of
its own on that port that answers probes only (Health/Check, ServerLive, ServerReady), with its own few
connections (HEALTH_CONNECTIONS), so that a probe sent there is answered whatever fills the main port (20 of 20).
A second port of the main server would have its own count of connections too (grpc counts them per listener,
measured), but the same limit and every RPC: whoever reached it could run inferences there.
"""

from __future__ import annotations

import asyncio
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
# RPCs at once on one connection (a client's further calls wait for one to end): at 16, a client at concurrency 16
# had streams refused (RST_STREAM 7, tests/suites/test_grpc_load.py). The budget, not this, bounds the messages held.
MAX_STREAMS = 32
SERIALIZERS: dict[str, Callable[[Any], bytes]] = {
    "ModelInfer": wire.serialize_infer,
    "ModelStreamInfer": wire.serialize_stream,
}
GATED = {"ModelInfer"}  # read only once the budget has room (calls.gated); a stream's messages too (service.py)
PARSERS: dict[str, Callable[[bytes], Any]] = {"ModelInfer": wire.parse_infer, "ModelStreamInfer": wire.parse_infer}
# The probes' server (NORMSERVE_GRPC_HEALTH_PORT): a kubelet and grpc_health_probe open a connection per probe and
# close it once answered, so a few per worker are plenty; none is held longer than the header timeout.
HEALTH_HINT = "NORMSERVE_GRPC_HEALTH_PORT"
HEALTH_CONNECTIONS = 8
HEALTH_MESSAGE_BYTES = 4096  # a probe's request is a service name
# Health/Watch is left out: a stream held for as long as its client likes would take one of the few connections.
PROBES = {"inference.GRPCInferenceService": ("ServerLive", "ServerReady"), "grpc.health.v1.Health": ("Check",)}


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bounds(settings: Settings, connections: int) -> list[tuple[str, int]]:
    """What both servers hold a connection to: `connections` at once, each closed at the header timeout until it
    has sent its preface and SETTINGS, and when it has had no RPC for as long."""
    timeout_ms = int(settings.header_timeout_s * 1000)
    return [
        ("grpc.so_reuseport", 1),  # every worker binds the port (module docstring)
        # Connections that sent nothing, or never an RPC, were never closed (issue 22): as HTTP's head deadline.
        ("grpc.server_handshake_timeout_ms", timeout_ms),
        # The handshake ends with the client's SETTINGS: a connection that sent its preface and SETTINGS and then
        # nothing was kept for the 5 minutes this was (issue 37, D7). Clients reconnect when they next call, as
        # HTTP clients do after uvicorn's 5 s keep-alive.
        ("grpc.max_connection_idle_ms", timeout_ms),
        ("grpc.max_allowed_incoming_connections", connections),
    ]


def options(settings: Settings) -> list[tuple[str, int]]:
    return [
        *bounds(settings, connection_limit(settings)),
        ("grpc.max_receive_message_length", settings.max_body_bytes),  # decompressed too
        ("grpc.max_send_message_length", -1),  # answers are bounded by the inputs' limits, as over HTTP
        # Messages grpc buffers before a handler can count them in NORMSERVE_MAX_INFLIGHT_BYTES (budget.py).
        ("grpc.max_concurrent_streams", MAX_STREAMS),
        # grpc grows each stream's flow-control window to the link's bandwidth-delay product: on loopback,
        # calls waiting for room in the budget had megabytes each buffered beyond it (32 concurrent 61 MiB
        # calls at NORMSERVE_MAX_IN_FLIGHT=2: +1,108-1,625 MiB with it, +891-957 without; one such call took
        # 0.7-1.0 s either way, scripts/peak_memory.py).
        ("grpc.http2.bdp_probe", 0),
    ]


def health_options(settings: Settings) -> list[tuple[str, int]]:
    return [
        *bounds(settings, HEALTH_CONNECTIONS),
        ("grpc.max_receive_message_length", HEALTH_MESSAGE_BYTES),
        ("grpc.max_concurrent_streams", len(PROBES)),
    ]


async def _unimplemented(request: Any, context: Any, call: calls.Call) -> Any:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"normserve does not implement {call.method}")


async def _not_a_probe(request: Any, context: Any, call: calls.Call) -> Any:
    await context.abort(
        grpc.StatusCode.UNIMPLEMENTED,
        f"{HEALTH_HINT} answers only ServerLive, ServerReady and grpc.health.v1.Health/Check; "
        f"call {call.method} on NORMSERVE_GRPC_PORT",
    )


def _streamed(fn: calls.Unary) -> calls.Streaming:
    """A missing streaming RPC: the abort of `fn` from a stream (grpc iterates a streaming handler's answer)."""

    async def stream(request: Any, context: Any, call: calls.Call) -> AsyncIterator[Any]:
        await fn(request, context, call)
        return
        yield  # an async generator, which ends with the abort

    return stream


class Only:
    """The methods of `impl` named in `names`, and no other (handlers() answers those with `missing`)."""

    def __init__(self, impl: object, names: tuple[str, ...]) -> None:
        for name in names:
            setattr(self, name, getattr(impl, name))


def handlers(
    descriptor: Any,
    messages: ModuleType,
    impl: object,
    settings: Settings | None = None,
    budget: Budget | None = None,
    missing: calls.Unary = _unimplemented,
) -> dict[str, grpc.RpcMethodHandler]:
    """A handler for every RPC of a service descriptor, wrapped by calls.py; `missing` (UNIMPLEMENTED) where impl has
    none. With a budget, ModelInfer reads its message only once NORMSERVE_MAX_BODY_BYTES fit in it (calls.gated)."""
    table: dict[str, grpc.RpcMethodHandler] = {}
    for method in descriptor.methods:
        request_type = getattr(messages, method.input_type.name)
        response_type = getattr(messages, method.output_type.name)
        fn: Any = getattr(impl, method.name, _streamed(missing) if method.server_streaming else missing)
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
    # No limit of RPCs at once: grpc's (maximum_concurrent_rpcs) refused every RPC past it, health checks too, and
    # 80 streams that sent nothing held all of it (issue 37, D3). Inferences are bounded by admission and the
    # budget, streams by their own limit and idle deadline (service.py), and RPCs per connection by MAX_STREAMS.
    server = grpc.aio.server(options=options(settings))
    inference_service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    table = handlers(inference_service, pb, inference, settings, worker.budget)
    _register(server, inference_service.full_name, table)
    health_service = health_pb2.DESCRIPTOR.services_by_name["Health"]
    _register(server, health_service.full_name, handlers(health_service, health_pb2, checks))
    names = (inference_service.full_name, health_service.full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)  # the descriptors of tritonclient's and grpc's modules
    return server, inference, checks


def build_probes(
    settings: Settings, inference: service.InferenceService, checks: health.HealthService
) -> grpc.aio.Server:
    """The server of NORMSERVE_GRPC_HEALTH_PORT: the probes of both services, on the same state as the main port's."""
    server = grpc.aio.server(options=health_options(settings))
    for descriptor, messages, impl in (
        (pb.DESCRIPTOR.services_by_name["GRPCInferenceService"], pb, inference),
        (health_pb2.DESCRIPTOR.services_by_name["Health"], health_pb2, checks),
    ):
        probes = Only(impl, PROBES[descriptor.full_name])
        _register(server, descriptor.full_name, handlers(descriptor, messages, probes, missing=_not_a_probe))
    return server


def grace_s(worker: Worker) -> float:
    """What is left of the drain timeout (all of it without a SIGTERM), at least MIN_GRACE_S."""
    spent = 0.0 if worker.drain.signalled_at is None else time.monotonic() - worker.drain.signalled_at
    return max(MIN_GRACE_S, worker.settings.drain_timeout_s - spent)


def _listen(server: grpc.aio.Server, where: str, port: int, hint: str = group.ENV_HINT) -> IO[str]:
    """Claim the port for this server, then bind it: PortTaken (logged) when either fails, and the worker does not
    start half-served (uvicorn ends the server). `hint` names the setting that chooses the port."""
    try:
        claim = group.claim_grpc_port(port, hint=hint)
    except group.PortTaken as e:
        log.error("%s", e, extra={"grpc_address": where})  # the one line to read among uvicorn's traceback
        raise
    try:
        server.add_insecure_port(where)
    except RuntimeError:  # held by a process that is no normserve, or not an address of this host
        claim.close()
        error = group.PortTaken(
            f"cannot listen for gRPC on {where} (in use, or not an address of this host); choose another with {hint}"
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
    listening = [(server, address(settings.host, settings.grpc_port), settings.grpc_port, group.ENV_HINT)]
    if settings.grpc_health_port:
        where = address(settings.host, settings.grpc_health_port)
        listening.append((build_probes(settings, inference, checks), where, settings.grpc_health_port, HEALTH_HINT))
    claims: list[IO[str]] = []
    try:
        if settings.grpc_health_port == settings.grpc_port:  # SO_REUSEPORT would let both bind it and split probes
            error = group.PortTaken(f"{HEALTH_HINT} must differ from NORMSERVE_GRPC_PORT ({settings.grpc_port})")
            log.error("%s", error, extra={"grpc_address": listening[0][1]})
            raise error
        for each, where, port, hint in listening:
            claims.append(_listen(each, where, port, hint))
    except group.PortTaken:
        for claim in claims:
            claim.close()
        raise
    for each, where, _, hint in listening:
        await each.start()
        log.info(
            "gRPC %slistening on %s", "probes " if hint == HEALTH_HINT else "", where, extra={"grpc_address": where}
        )
    try:
        yield server
    finally:
        for claim in claims:
            claim.close()
        # The drain (SIGTERM) has already waited for in-flight inferences; mark draining in case no signal came,
        # so that RPCs arriving during the grace answer UNAVAILABLE (probes NOT_SERVING, on either port), then end
        # idle streams and stop.
        worker.admission.draining = True
        inference.close()
        checks.close()
        await asyncio.gather(*(each.stop(grace_s(worker)) for each, *_ in listening))
