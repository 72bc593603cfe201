"""ModelStreamInfer streams cannot starve a worker (issue 37, D3 and D6), on a real server: idle streams are limited
per worker and ended after NORMSERVE_STREAM_IDLE_S, health checks and inferences are answered meanwhile, and a
stream's messages are counted in NORMSERVE_MAX_INFLIGHT_BYTES before the next one is read (peak RSS from
/proc/PID/status, as tests/suites/test_memory_budget.py measures it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from app.core.reference import layer_norm
from benchmarks import grpc_load
from benchmarks.servers import free_port, memory_kib
from tests.live_server import server_process
from tests.suites.test_memory_budget import reset_peak

IDLE_S = 2.0
STREAMS = 4  # NORMSERVE_MAX_IN_FLIGHT: streams open per worker
BUDGET = 4 * 2**20


@dataclass
class Served:
    port: int
    pid: int


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    port = free_port()
    env = {
        "NORMSERVE_GRPC_PORT": str(port),
        "NORMSERVE_MAX_IN_FLIGHT": str(STREAMS),
        "NORMSERVE_STREAM_IDLE_S": str(IDLE_S),
        "NORMSERVE_MAX_INFLIGHT_BYTES": str(BUDGET),
    }
    with server_process(env) as (_, proc):
        yield Served(port, proc.pid)


def infer_message(x: np.ndarray) -> pb.ModelInferRequest:
    return pb.ModelInferRequest.FromString(grpc_load.infer_request(x))


def test_idle_streams_leave_health_checks_and_inferences_answered_and_end_when_idle(served: Served) -> None:
    # D3: 80 streams that sent nothing took every RPC slot of a worker (NORMSERVE_MAX_IN_FLIGHT + 16): ServerLive,
    # ModelInfer and the health check all failed RESOURCE_EXHAUSTED for as long as they stayed open.
    release = threading.Event()

    def nothing() -> Iterator[pb.ModelInferRequest]:
        release.wait(30)
        return
        yield pb.ModelInferRequest()

    with grpc.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        start = time.monotonic()
        streams = [stub.ModelStreamInfer(nothing()) for _ in range(STREAMS + 20)]
        time.sleep(0.5)
        # Another client: its own connection (channels in one process share one unless told not to).
        own = [("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(f"127.0.0.1:{served.port}", options=own) as probe:
            live = service_pb2_grpc.GRPCInferenceServiceStub(probe).ServerLive(pb.ServerLiveRequest(), timeout=2)
            check = health_pb2_grpc.HealthStub(probe).Check(health_pb2.HealthCheckRequest(), timeout=2)
            x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
            out = grpc_load.output_of(grpc_load.check(served.port, grpc_load.infer_request(x)))
        assert live.live and check.status == health_pb2.HealthCheckResponse.SERVING
        np.testing.assert_allclose(out, layer_norm(x.astype(np.float64)).output, atol=1e-4)
        ended: list[tuple[grpc.StatusCode, str, float]] = []
        for stream in streams:
            with pytest.raises(grpc.RpcError) as e:
                next(stream)
            ended.append((e.value.code(), e.value.details(), time.monotonic() - start))  # type: ignore[attr-defined]
        release.set()
    over = (grpc.StatusCode.UNAVAILABLE, f"{STREAMS} streams open, the limit (NORMSERVE_MAX_IN_FLIGHT)")
    idle = (grpc.StatusCode.DEADLINE_EXCEEDED, f"stream: no request within {IDLE_S:g} s (NORMSERVE_STREAM_IDLE_S)")
    assert sorted((e[:2] for e in ended), key=str) == sorted([idle] * STREAMS + [over] * 20, key=str)
    assert all(IDLE_S <= took < IDLE_S + 2 for code, _, took in ended if code == idle[0])


def test_stream_messages_are_counted_before_the_next_is_read(served: Served) -> None:
    # D6: each stream read up to 16 messages ahead before the budget counted them; 8 streams of 48 MiB messages
    # took a worker to +2.3 GiB. Scaled down: 4 streams of 16 messages of 2 MiB against a 4 MiB budget. What
    # remains is each stream's one message being read, in grpc's buffers and copies, and the answers being sent.
    x = np.random.default_rng(1).standard_normal((512, 1024)).astype(np.float32)  # 2 MiB
    message = infer_message(x)
    expected = layer_norm(x[:16].astype(np.float64)).output
    with grpc.insecure_channel(f"127.0.0.1:{served.port}", options=grpc_load.OPTIONS) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        rest = reset_peak(served.pid)
        streams = [stub.ModelStreamInfer(iter([message] * 16)) for _ in range(4)]
        with ThreadPoolExecutor(4) as pool:  # each stream's answers read as they come
            answers = list(pool.map(list, streams))
        peak = memory_kib(served.pid)["VmHWM"] * 1024
    refused = 0
    for stream in answers:
        assert len(stream) == 16
        for a in stream:
            if a.error_message:
                assert "would pass the limit of 4194304 bytes of request bodies in flight" in a.error_message
                refused += 1
            else:
                got = np.frombuffer(a.infer_response.raw_output_contents[0], np.float32).reshape(x.shape)
                np.testing.assert_allclose(got[:16], expected, atol=1e-4)
    print(f"4 streams x 16 messages of 2 MiB: +{(peak - rest) / 2**20:.0f} MiB, {refused} refused in-stream")
    assert peak - rest <= 4 * BUDGET + 4 * 8 * x.nbytes, f"+{(peak - rest) / 2**20:.0f} MiB"
