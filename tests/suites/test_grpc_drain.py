"""SIGTERM during gRPC load: health NOT_SERVING at once, new calls UNAVAILABLE, accepted calls finish, then exit.

As the HTTP drain test (tests/suites/test_drain.py): long encoder inferences (raw tensors, tenths of a second
each), and the signal only once every client's call has been in the server for ACCEPTED_S, so that "accepted
before the signal" is a fact. A health Check poller on its own channel, back to back, times NOT_SERVING.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb

from tests.grpc_loadgen import request, stub
from tests.server.api.v2.grpc.live import GrpcServer, grpc_server

pytestmark = pytest.mark.slow

CLIENTS = 4
ACCEPTED_S = 0.3  # a 4 MiB message is in the server well within this on loopback
NOT_SERVING_WITHIN_S = 0.1
SHUTTING_DOWN = "server is shutting down; retry on another replica"
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
UNLIMITED = [("grpc.max_receive_message_length", -1)]  # the encoder's answer is 4.3 MB, over grpc's default 4 MiB


@dataclass
class Call:
    sent: float
    done: float = 0.0
    code: grpc.StatusCode | None = None
    details: str = ""


@dataclass
class Load:
    """CLIENTS threads, each on its own channel, sending one long call after another until told to stop."""

    address: str
    body: Any
    calls: list[Call] = field(default_factory=list)
    current: dict[int, Call] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def client(self, i: int) -> None:
        with grpc.insecure_channel(self.address, options=UNLIMITED) as channel:
            infer = stub(channel).ModelInfer
            while not self.stop.is_set():
                call = self.current[i] = Call(time.monotonic())
                self.calls.append(call)
                try:
                    infer(self.body, timeout=60)
                    call.code = grpc.StatusCode.OK
                except grpc.RpcError as e:
                    call.code, call.details = e.code(), e.details() or ""
                call.done = time.monotonic()

    def all_accepted(self) -> bool:
        now = time.monotonic()
        busy = [c for c in self.current.values() if c.done == 0.0]
        return len(busy) == CLIENTS and all(now - c.sent >= ACCEPTED_S for c in busy)


def poll_health(address: str, polls: list[tuple[float, float, int]], stop: threading.Event) -> None:
    """Check back to back on one channel, as a load balancer's probe would, until three NOT_SERVING answers."""
    with grpc.insecure_channel(address) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        while not stop.is_set() and sum(status == NOT_SERVING for *_, status in polls) < 3:
            sent = time.monotonic()
            try:
                status = check(health_pb2.HealthCheckRequest(), timeout=5).status
            except grpc.RpcError:
                return
            polls.append((sent, time.monotonic(), status))


def probe_new_calls(address: str) -> tuple[tuple[Any, str], bool]:
    """A new ModelInfer and ServerReady on a new channel while the drain runs."""
    with grpc.insecure_channel(address) as channel:
        try:
            stub(channel).ModelInfer(request("layernorm", [("input", np.ones((2, 3), np.float32))]), timeout=10)
            infer: tuple[Any, str] = (grpc.StatusCode.OK, "")
        except grpc.RpcError as e:
            infer = (e.code(), e.details() or "")
        return infer, stub(channel).ServerReady(pb.ServerReadyRequest(), timeout=10).ready


def drain(server: GrpcServer) -> dict[str, Any]:
    x = np.random.default_rng(1).standard_normal((16, 512, 128)).astype(np.float32)
    load = Load(server.address, request("encoder", [("input", x)]))
    polls: list[tuple[float, float, int]] = []
    stop_polls = threading.Event()
    threads = [threading.Thread(target=load.client, args=(i,), daemon=True) for i in range(CLIENTS)]
    threads.append(threading.Thread(target=poll_health, args=(server.address, polls, stop_polls), daemon=True))
    for t in threads:
        t.start()
    start = time.monotonic()
    while time.monotonic() - start < 1.0 or not load.all_accepted():
        assert time.monotonic() - start < 60, "the load never had every client's call in the server"
        time.sleep(0.01)
    t_sig = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    load.stop.set()
    while not any(status == NOT_SERVING for *_, status in polls) and time.monotonic() - t_sig < 2:
        time.sleep(0.005)
    probe = probe_new_calls(server.address)
    exit_code = server.proc.wait(timeout=60)
    exited = time.monotonic()
    stop_polls.set()
    for t in threads:
        t.join(timeout=30)
    return {"t_sig": t_sig, "calls": load.calls, "polls": polls, "probe": probe, "exit": exit_code, "exited": exited}


def test_sigterm_during_grpc_load_finishes_accepted_calls_and_refuses_new_ones(tmp_path: Path) -> None:
    env = {"NORMSERVE_INTRA_OP_THREADS": "1", "NORMSERVE_LOG_LEVEL": "warning"}
    with grpc_server(tmp_path, env) as server:
        run = drain(server)
    t_sig = run["t_sig"]
    accepted = [c for c in run["calls"] if c.sent < t_sig]
    first_not_serving = next(recv for sent, recv, status in run["polls"] if status == NOT_SERVING)
    print(
        f"\ngRPC drain: accepted {len(accepted)}, in flight at the signal {sum(c.done > t_sig for c in accepted)}, "
        f"NOT_SERVING after {(first_not_serving - t_sig) * 1000:.1f} ms, exit after {run['exited'] - t_sig:.2f} s"
    )
    assert [(c.code, c.details) for c in accepted] == [(grpc.StatusCode.OK, "")] * len(accepted)
    assert sum(c.done > t_sig for c in accepted) == CLIENTS, "the calls in flight at the signal were drained"
    assert first_not_serving - t_sig < NOT_SERVING_WITHIN_S
    # Never back to SERVING once NOT_SERVING. A poll sent in the moment after the signal may still be answered
    # SERVING: the signal reaches the event loop asynchronously (within NOT_SERVING_WITHIN_S, asserted above).
    assert {status for sent, _, status in run["polls"] if sent >= first_not_serving} == {NOT_SERVING}
    assert run["probe"] == ((grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN), False)
    assert run["exit"] in (0, -signal.SIGTERM)
    assert run["exited"] >= max(c.done for c in accepted), "the process exited before its accepted calls finished"
