"""Bursts of repository loads on a server of several workers: each call answers within its bounded wait (OK, or
503 / UNAVAILABLE once it ran out), every worker converges, and SIGTERM drains within its timeout however many wait.

A real `normserve serve --workers 3` in explicit mode; each gRPC call on its own channel (a local subchannel pool),
so that the kernel spreads the calls over the workers, as independent clients' calls are.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as service

from benchmarks.servers import HOST, Server, free_port
from tests.cli.normserve import NORMSERVE
from tests.live_server import cli_server
from tests.repositories import copy_models, learned_layernorm
from tests.server.test_modelsync import TOKEN, all_started, explicit_env, versions

WORKERS = 3
CALLS = 24
DEADLINE_S = 20.0  # each call's gRPC deadline: the old code held 23 of 24 calls past any deadline
WAIT_S = 2.0  # NORMSERVE_MODEL_CONTROL_WAIT_S: a queued call refused past it, well within its deadline
DRAIN_S = 3.0  # NORMSERVE_DRAIN_TIMEOUT_S
BUSY = (
    "model control is busy: this load waited 2 s (NORMSERVE_MODEL_CONTROL_WAIT_S) behind other loads and "
    "unloads of the server; retry"
)


def _load(address: str, outcomes: list[tuple[str, str]]) -> None:
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        try:
            service.GRPCInferenceServiceStub(channel).RepositoryModelLoad(
                pb.RepositoryModelLoadRequest(model_name="ln"),
                metadata=[("authorization", f"Bearer {TOKEN}")],
                timeout=DEADLINE_S,
            )
        except grpc.RpcError as e:
            outcomes.append((e.code().name, e.details() or ""))
        else:
            outcomes.append(("OK", ""))


def _storm(address: str) -> tuple[list[tuple[str, str]], list[threading.Thread]]:
    outcomes: list[tuple[str, str]] = []
    threads = [threading.Thread(target=_load, args=(address, outcomes)) for _ in range(CALLS)]
    for t in threads:
        t.start()
    return outcomes, threads


def _serve(tmp_path: Path, grpc_port: int) -> tuple[list[str], dict[str, str]]:
    repository = copy_models(tmp_path / "models", ("layernorm",))
    learned_layernorm(repository, "ln", 1, np.ones(8, np.float32), np.zeros(8, np.float32))
    env = explicit_env(
        repository, grpc_port=str(grpc_port), model_control_wait_s=str(WAIT_S), drain_timeout_s=str(DRAIN_S)
    )
    return [str(NORMSERVE), "serve", "--workers", str(WORKERS)], env


def _stopped_in(server: Server, bound_s: float) -> float:
    """SIGTERM, then the seconds until the server exited (inf past bound_s: then it is killed, workers first)."""
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=bound_s)
    except subprocess.TimeoutExpired:
        children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
        for child in children:  # this test's server's workers, by pid: they would outlive a killed parent
            os.kill(int(child), signal.SIGKILL)
        server.proc.kill()
        server.proc.wait()
        return float("inf")
    return time.monotonic() - start


def test_a_burst_of_loads_answers_each_within_its_wait_and_every_worker_converges(tmp_path: Path) -> None:
    grpc_port = free_port()
    command, env = _serve(tmp_path, grpc_port)
    with cli_server(command, env) as server:
        all_started(server, WORKERS)
        started = time.monotonic()
        outcomes, threads = _storm(f"{HOST}:{grpc_port}")
        for t in threads:
            t.join()
        took = time.monotonic() - started
        counts = Counter(code for code, _ in outcomes)
        print(f"\n{CALLS} concurrent gRPC loads on {WORKERS} workers: {dict(counts)} in {took:.1f} s")
        assert set(outcomes) <= {("OK", ""), ("UNAVAILABLE", BUSY)}, counts
        assert counts["OK"] >= 1
        assert versions(server.base, "ln") == {(200, ("1",))}
        drained = _stopped_in(server, DRAIN_S + 20)
        print(f"SIGTERM after the burst: exited in {drained:.1f} s")
        assert drained < DRAIN_S + 10


def test_sigterm_drains_within_its_timeout_while_loads_are_queued(tmp_path: Path) -> None:
    grpc_port = free_port()
    command, env = _serve(tmp_path, grpc_port)
    with cli_server(command, env) as server:
        all_started(server, WORKERS)
        outcomes, threads = _storm(f"{HOST}:{grpc_port}")
        time.sleep(0.5)  # the calls have reached the workers and queue there
        drained = _stopped_in(server, DRAIN_S + 20)
        for t in threads:
            t.join()
        print(
            f"\nSIGTERM with {CALLS} loads queued: exited in {drained:.1f} s; {dict(Counter(c for c, _ in outcomes))}"
        )
        assert drained < DRAIN_S + 10
        assert "DEADLINE_EXCEEDED" not in {code for code, _ in outcomes}


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_load_queued_behind_a_longer_one_answers_503_past_its_wait_and_inference_goes_on(
    tmp_path: Path, transport: str
) -> None:
    """The encoder's load (sessions, parity warm-up: about 0.4 s) lasts longer than the 0.05 s a second load may
    wait for it."""
    repository = copy_models(tmp_path / "models", ("layernorm", "encoder"))
    grpc_port = free_port()
    env = explicit_env(repository, grpc_port=str(grpc_port), model_control_wait_s="0.05", startup_models="layernorm")
    with (
        cli_server([str(NORMSERVE), "serve", "--workers", "1"], env) as server,
        grpc.insecure_channel(f"{HOST}:{grpc_port}") as channel,
    ):
        # Connected before the slow load starts: a channel's first connection can outlast the 0.4 s load on a busy
        # machine, and then the second load would come after the first, not behind it.
        grpc.channel_ready_future(channel).result(timeout=30)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        slow = threading.Thread(
            target=httpx.post, args=(f"{server.base}/v2/repository/models/encoder/load",), kwargs={"headers": auth}
        )
        slow.start()
        deadline = time.monotonic() + 10
        client = httpx.Client(base_url=server.base, headers=auth, timeout=30)  # made before: it takes 0.1 s or more
        while ["encoder", "1", "LOADING"] not in _index(client):  # it builds the encoder's sessions
            assert time.monotonic() < deadline, "the encoder's load never started"
        if transport == "http":
            r = client.post("/v2/repository/models/layernorm/load")
            refused = (r.status_code, r.json()["error"], r.headers.get("retry-after"))
        else:
            try:
                service.GRPCInferenceServiceStub(channel).RepositoryModelLoad(
                    pb.RepositoryModelLoadRequest(model_name="layernorm"),
                    metadata=[("authorization", f"Bearer {TOKEN}")],
                    timeout=30,
                )
                refused = (0, "OK", None)
            except grpc.RpcError as e:
                trailer = dict(e.trailing_metadata() or ())  # type: ignore[attr-defined]
                refused = (e.code().value[0], e.details(), trailer.get("retry-after"))
        inference = client.post("/normalize", json={"model": "layernorm", "data": [[1.0, 3.0]]})
        slow.join()
        client.close()
    code = 503 if transport == "http" else grpc.StatusCode.UNAVAILABLE.value[0]
    assert refused == (code, BUSY.replace("2 s", "0.05 s"), "1")
    assert inference.status_code == 200


def _index(client: httpx.Client) -> list[list[str]]:
    rows = client.post("/v2/repository/index").json()
    return [[row["name"], row["version"], row["state"]] for row in rows]
