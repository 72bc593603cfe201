"""One gRPC port per server: a second server on a taken gRPC port exits at once, and the first answers every call.

Real servers: `normserve serve --workers 2` owns the port (both workers listen on it), then a second
`normserve serve`, and a second uvicorn started directly, each try the same gRPC port. The first server
serves a model the others do not have, so a call the second one took would come back NOT_FOUND.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from benchmarks.servers import HOST, free_port, server_process
from tests.cli.normserve import NORMSERVE
from tests.live_server import MODELS, ROOT, cli_server, wait_every_worker_ready
from tests.repositories import copy_models, learned_layernorm

ONLY_FIRST = "first-only"
SECOND_EXIT_S = 30.0  # start-up of a second server: the interpreter, its imports, and the refusal


def _env(grpc_port: int, models: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "NORMSERVE_MODEL_DIR": str(models),
        "NORMSERVE_GRPC_PORT": str(grpc_port),
        "NORMSERVE_LOG_LEVEL": "warning",
        "PYTHONPATH": path,
    }


def _listeners(port: int, count: int) -> set[int]:
    """The pids of the processes listening on 127.0.0.1:port (iproute2's ss), once there are `count` (or 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
        pids = {int(pid) for pid in re.findall(r"pid=(\d+)", out)}
        if len(pids) >= count or time.monotonic() > deadline:  # a worker may still start while another is ready
            return pids
        time.sleep(0.1)


def _second(command: list[str], env: dict[str, str]) -> tuple[int, str, float]:
    start = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=SECOND_EXIT_S)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def test_a_second_server_on_a_taken_grpc_port_exits_and_takes_no_call_of_the_first(tmp_path: Path) -> None:
    first_models = copy_models(tmp_path / "first", ("layernorm",))
    learned_layernorm(first_models, ONLY_FIRST, 1, np.ones(4, np.float32), np.zeros(4, np.float32))
    grpc_port = free_port()
    env = _env(grpc_port, first_models)
    with cli_server([str(NORMSERVE), "serve", "--workers", "2"], env) as first:
        workers = _listeners(grpc_port, 2)
        assert len(workers) == 2 and first.pid not in workers  # each worker listens on the one port

        code, output, seconds = _second(
            [str(NORMSERVE), "serve", "--port", str(free_port()), "--grpc-port", str(grpc_port)], _env(0, MODELS)
        )
        assert (code, output.splitlines()) == (
            2,
            [
                f"normserve serve: error: gRPC port {grpc_port} on {HOST} is already in use; "
                "choose another with --grpc-port or NORMSERVE_GRPC_PORT"
            ],
        )
        assert seconds < SECOND_EXIT_S

        refusal = (
            f"gRPC port {grpc_port} is already in use by another normserve server (pid {first.pid}); "
            "choose another with --grpc-port or NORMSERVE_GRPC_PORT"
        )
        uvicorn = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", HOST, "--port", str(free_port())]
        # One process: uvicorn's start-up failure (3). Several: its supervisor stops every worker, yet exits 0.
        for extra, status in (([], 3), (["--workers", "2"], 0)):
            code, output, seconds = _second([*uvicorn, *extra], _env(grpc_port, MODELS))
            errors = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
            assert code == status and seconds < SECOND_EXIT_S
            assert {e["msg"] for e in errors if e["logger"] == "normserve.lifecycle"} == {refusal}

        assert _listeners(grpc_port, 2) == workers
        for _ in range(40):  # each on a new connection, which the kernel may give to any listener
            client = grpcclient.InferenceServerClient(f"{HOST}:{grpc_port}")
            try:
                assert client.get_model_metadata(ONLY_FIRST).name == ONLY_FIRST
            finally:
                client.close()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_grpc_port_is_free_again_once_its_server_has_stopped(tmp_path: Path, workers: str) -> None:
    grpc_port = free_port()
    with cli_server([str(NORMSERVE), "serve", "--workers", workers], _env(grpc_port, MODELS)):
        pass
    with cli_server([str(NORMSERVE), "serve", "--workers", workers], _env(grpc_port, MODELS)) as again:
        wait_every_worker_ready(again.base)
        client = grpcclient.InferenceServerClient(f"{HOST}:{grpc_port}")
        try:
            assert client.is_server_ready()
        finally:
            client.close()
        assert again.proc.poll() is None


# A pre-fork server as gunicorn runs one: the parent binds the HTTP socket, forks its workers, and each execs a
# server on that socket (no multiprocessing parent); SIGTERM goes on to them.
PRE_FORK = """
import os, signal, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
os.set_inheritable(s.fileno(), True)
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, "-m", "uvicorn", "app.main:app", "--fd", str(s.fileno())])
    kids.append(pid)
signal.signal(signal.SIGTERM, lambda *_: [os.kill(k, signal.SIGTERM) for k in kids])
for k in kids:
    while True:
        try:
            os.waitpid(k, 0)
            break
        except InterruptedError:
            pass
"""


def test_workers_forked_on_one_socket_share_the_grpc_port_and_refuse_another_server() -> None:
    grpc_port, port = free_port(), free_port()
    command = [sys.executable, "-c", PRE_FORK, str(port)]
    with server_process(command, port=port, env=_env(grpc_port, MODELS), timeout=90) as first:
        workers = _listeners(grpc_port, 2)
        assert len(workers) == 2 and first.pid not in workers
        uvicorn = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", HOST, "--port", str(free_port())]
        code, output, _ = _second(uvicorn, _env(grpc_port, MODELS))
        errors = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
        refused = [e["msg"] for e in errors if e["logger"] == "normserve.lifecycle"]
        assert code == 3 and len(refused) == 1
        assert refused[0] in {  # named by the worker that claimed the port first
            f"gRPC port {grpc_port} is already in use by another normserve server (pid {pid}); "
            "choose another with --grpc-port or NORMSERVE_GRPC_PORT"
            for pid in workers
        }
        assert _listeners(grpc_port, 2) == workers
