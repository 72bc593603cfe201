"""The floors the target rows are multiples of, measured in the same run as the rows themselves.

HTTP: a trivial ASGI app on normserve's uvicorn command line (benchmarks/peers/trivial_asgi.py), a
server of section 3 like any other. V2 binary over HTTP: the request's bytes over a raw loopback socket,
one copy in, torch.nn.functional.layer_norm, one copy out, the answer's bytes back (`binary_floor`).
gRPC: a minimal grpcio server doing the same (benchmarks/peers/grpc_floor.py, `grpc_floor`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import numpy as np

from benchmarks import grpc_load, servers
from benchmarks.inprocess import binary_request, measure, sample

GRPC_FLOOR = "floor: grpcio"
ANSWER_HEADER = 200  # bytes: about the JSON header of a V2 binary answer with `output` alone


def binary_floor(shape: tuple[int, ...], budget_s: float) -> dict[str, Any]:
    """p50 of a V2 binary request's bytes in and the answer's out over 127.0.0.1, with the least work between."""
    import torch

    x = sample(shape)
    header, blob = binary_request(x)
    request, size = header + blob, len(header) + len(blob)
    listener = socket.create_server((servers.HOST, 0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as normserve's session (intra_op_threads=1)

    def serve() -> None:
        buf = bytearray(size)
        conn, _ = listener.accept()
        with conn:
            while _recv_exactly(conn, memoryview(buf)):
                t = torch.from_numpy(np.frombuffer(buf, np.float32, offset=len(header)).copy())  # copy in
                out = torch.nn.functional.layer_norm(t.reshape(shape), (shape[-1],), eps=1e-5)
                conn.sendall(b"h" * ANSWER_HEADER + out.numpy().tobytes())  # copy out

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    answer = bytearray(ANSWER_HEADER + len(blob))
    try:
        with socket.create_connection((servers.HOST, listener.getsockname()[1])) as client:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def round_trip() -> None:
                client.sendall(request)
                _recv_exactly(client, memoryview(answer))

            t = measure(round_trip, budget_s, max_runs=500)
    finally:
        listener.close()
        thread.join(timeout=5)
        torch.set_num_threads(threads)
    return {"shape": shape, "p50_ms": t.median_s * 1e3, "p99_ms": t.p99_s * 1e3, "runs": t.runs}


def _recv_exactly(conn: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


@contextmanager
def _grpc_floor_server() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    port = servers.free_port()
    env = {**os.environ, "PYTHONPATH": str(servers.ROOT)}
    cmd = [sys.executable, "-m", "benchmarks.peers.grpc_floor", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=servers.ROOT, env=env)
    try:
        with grpc.insecure_channel(f"{servers.HOST}:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=servers.READY_TIMEOUT_S)
        yield port, proc
    finally:
        servers.stop(proc)


def grpc_floor(
    cells: list[tuple[tuple[int, ...], int]],
    seconds: float,
    verifier: Callable[[np.ndarray], Callable[[np.ndarray], None]],
    load_row: Callable[[Any, float], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Section 3's rows of the gRPC floor server: each (shape, concurrency) cell, its answer checked first."""
    rows = []
    with _grpc_floor_server() as (port, proc):
        for shape, conc in cells:
            x = sample(shape)
            message = grpc_load.infer_request(x)
            grpc_load.check(port, message, verifier(x))
            cpu = servers.cpu_seconds(proc.pid)
            result = grpc_load.load(port, message, conc, seconds)
            cpu = servers.cpu_seconds(proc.pid) - cpu
            rows.append({"server": GRPC_FLOOR, "protocol": "gRPC", "shape": shape, "concurrency": conc})
            rows[-1].update(load_row(result, cpu))
    return rows
