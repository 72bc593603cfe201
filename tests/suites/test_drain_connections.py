"""Connections opened in the last moment of a drain (issue 37, D13), on a real server: a connection the worker
accepted before its shutdown, whose request was on its way, is answered (503, `Connection: close`), not closed
with the request unanswered. (Connections still in the kernel's queue of a listening socket that another process
holds, uvicorn's supervisor or this test's, are that process's: the worker never accepted them.)"""

from __future__ import annotations

import queue
import signal
import socket
import time

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from benchmarks import grpc_load
from benchmarks.servers import free_port
from tests.live_server import server_process
from tests.suites.test_connection_limits import closed_after

HEAD = b"GET /v2/health/ready HTTP/1.1\r\nHost: normserve\r\n\r\n"
DRAINING = b'{"ready":false,"error":"not ready: shutting down"}'


@pytest.mark.parametrize("first", [b"", HEAD[:20]], ids=["nothing-yet", "half-a-head"])
def test_a_request_on_its_way_as_the_drain_ends_is_answered_503_and_closed(first: bytes) -> None:
    with server_process({"NORMSERVE_LOG_LEVEL": "warning"}) as (base, proc):
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as s:
            s.sendall(first)
            time.sleep(0.2)  # accepted
            proc.send_signal(signal.SIGTERM)  # nothing in flight: the drain ends at once and uvicorn shuts down
            time.sleep(0.2)
            s.sendall(HEAD[len(first) :])
            got, _ = closed_after(s, 5.0)
        proc.wait(timeout=30)
    assert got.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), got
    assert b"connection: close\r\n" in got.lower() and got.endswith(DRAINING)


def test_a_stream_message_sent_as_the_server_stops_is_answered_and_the_stream_ends_unavailable() -> None:
    # D13: a ModelStreamInfer stream ended OK with one sent message unanswered.
    grpc_port = free_port()
    sent: queue.Queue[pb.ModelInferRequest | None] = queue.Queue()
    request = pb.ModelInferRequest.FromString(grpc_load.infer_request(np.ones((1, 4), np.float32)))
    with server_process({"NORMSERVE_GRPC_PORT": str(grpc_port), "NORMSERVE_LOG_LEVEL": "warning"}) as (_, proc):
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(sent.get, None))
            sent.put(request)
            first = next(stream)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            sent.put(request)  # while the server stops
            second = next(stream)
            with pytest.raises(grpc.RpcError) as ended:
                next(stream)
            sent.put(None)
        proc.wait(timeout=30)
    assert not first.error_message and second.error_message == "server is shutting down; retry on another replica"
    assert (ended.value.code(), ended.value.details()) == (  # type: ignore[attr-defined]
        grpc.StatusCode.UNAVAILABLE,
        "server is shutting down; retry on another replica",
    )
