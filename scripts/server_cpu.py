"""Server CPU per request over HTTP: normserve beside a trivial ASGI app on the same uvicorn, uvloop and httptools.

Both servers run at once, one process each; a client here sends the same POST to each in turn (keep-alive,
one request at a time, a raw socket: the client's own cost never lands on the servers), and each server's
CPU (user + system, /proc/PID/stat) is read around each round. Medians of the rounds, ratios side by side.
Logs are at info (the access line on, to a file) and metrics on, as normserve runs by default.

    python scripts/server_cpu.py [--requests 2000] [--rounds 7] [--case normalize|v2json|v2binary|all]
    python scripts/server_cpu.py --memory    # section 5 of docs/benchmarks.md: peak RSS of a 64 MiB request
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import servers  # noqa: E402
from benchmarks.inprocess import sample  # noqa: E402
from benchmarks.serving import make_request  # noqa: E402

CASES = {"normalize": "/normalize JSON", "v2json": "V2 JSON", "v2binary": "V2 binary"}
SHAPES = {"normalize": (1, 8, 64), "v2json": (1, 8, 64), "v2binary": (8, 128, 768)}


async def trivial(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The floor: reads the body, answers 2 bytes of JSON."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"{}"})


def _raw(path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _exchange(sock: socket.socket, raw: bytes) -> None:
    """Send one request, read its whole answer (Content-Length)."""
    sock.sendall(raw)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(1 << 20)
    head, _, rest = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))
    lines = head.lower().split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
    while len(rest) < length:
        rest += sock.recv(1 << 22)


def _cpu_per_request(server: Any, raw: bytes, requests: int) -> float:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        _exchange(sock, raw)
        before = servers.cpu_seconds(server.pid)
        for _ in range(requests):
            _exchange(sock, raw)
        return (servers.cpu_seconds(server.pid) - before) / requests * 1e3


@contextmanager
def _servers(log: Path) -> Iterator[tuple[Any, Any]]:
    env = {**os.environ, "NORMSERVE_MODEL_DIR": str(ROOT / "models"), "NORMSERVE_LOG_LEVEL": "info"}
    env.update(NORMSERVE_GRPC_PORT="0", PYTHONPATH=str(ROOT))
    with ExitStack() as stack:
        normserve = stack.enter_context(
            servers.server_process(servers.normserve_command(), env=env, output=log, cwd=ROOT)
        )
        command = servers.uvicorn_command(*servers.normserve_command()[4:], app="scripts.server_cpu:trivial")
        floor = stack.enter_context(servers.server_process(command, env=env, ready="/", cwd=ROOT))
        yield normserve, floor


def cpu(cases: list[str], requests: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, _servers(Path(tmp) / "server.log") as (normserve, floor):
        for case in cases:
            request = make_request(CASES[case], sample(SHAPES[case]))
            raw = _raw(request.path, request.body, request.headers)
            n = max(20, requests // (100 if case == "v2binary" else 1))
            figures: dict[str, list[float]] = {"normserve": [], "trivial": []}
            for _ in range(rounds):
                figures["normserve"].append(_cpu_per_request(normserve, raw, n))
                figures["trivial"].append(_cpu_per_request(floor, raw, n))
            ns, tr = (statistics.median(figures[k]) for k in ("normserve", "trivial"))
            print(
                f"{case:9} {SHAPES[case]!s:14} body {len(request.body):>9} B  normserve {ns:7.3f} ms  "
                f"trivial {tr:6.3f} ms  ratio {ns / tr:5.1f}x  (median of {rounds} rounds of {n})"
            )


def memory(payload_bytes: int) -> None:
    from benchmarks.serving import memory_section

    for row in memory_section(payload_bytes, lambda message: None):
        body, peak, idle = row["payload_bytes"], row["peak_rss_bytes"], row["idle_rss_bytes"]
        print(
            f"{row['protocol']:16} body {body / 2**20:5.1f} MiB idle {idle / 2**20:5.0f} MiB "
            f"peak {peak / 2**20:5.0f} MiB  peak/body {peak / body:4.2f}  (peak-idle)/body "
            f"{(peak - idle) / body:4.2f}  {row['seconds']:.2f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--payload-mib", type=float, default=64)
    args = parser.parse_args()
    np.seterr(all="ignore")
    if args.memory:
        memory(int(args.payload_mib * 2**20))
        return
    cpu(list(CASES) if args.case == "all" else [args.case], args.requests, args.rounds)


if __name__ == "__main__":
    main()
