"""What tracing costs per request, in process: POST /normalize through the whole ASGI app, tracing off and on.

Each mode runs in a process of its own (the OTEL_* variables are read once per worker): off (no endpoint),
off with a traceparent (the trace id goes in the log line only), and on with every request exported to a
receiver in another process that answers 200. No network and no uvicorn: the app is called directly, so
the figure is the app's own CPU per request. Prints a Markdown table (docs/operations.md, Overhead).

    python scripts/trace_overhead.py [--requests 20000] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BODY = b'{"data": [[0.2, 0.1, 0.3]]}'
TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
MODES = ("off", "off+traceparent", "on")
# A receiver that takes any POST and answers 200: the exporter's other end, in its own process.
RECEIVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 0), H); print(s.server_address[1], flush=True); s.serve_forever()
"""


async def _request(app: Any, headers: list[tuple[bytes, bytes]]) -> None:
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/normalize", "raw_path": b"/normalize"}
    scope["query_string"] = b""
    scope.update({"headers": headers, "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 8000)})
    scope.update({"client": ("127.0.0.1", 1), "root_path": ""})
    scope["asgi"] = {"version": "3.0"}
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise RuntimeError(f"status {message['status']}")

    await app(scope, receive, send)


async def _measure(mode: str, requests: int, runs: int) -> list[float]:
    from app.server.app import create_app, lifespan
    from app.settings import Settings

    app = create_app(Settings(model_dir=ROOT / "models", grpc_port=0, log_level="warning", batch_max_size=1))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]
    if mode != "off":
        headers.append((b"traceparent", TRACEPARENT))
    async with lifespan(app):
        while not app.state.worker.admission.ready:
            await asyncio.sleep(0.05)
        for _ in range(500):  # warm up
            await _request(app, headers)
        per_request = []
        for _ in range(runs):
            start = time.perf_counter()
            for _ in range(requests):
                await _request(app, headers)
            per_request.append((time.perf_counter() - start) / requests * 1e6)
    return per_request


def _child(mode: str, requests: int, runs: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    receiver = None
    if mode == "on":
        receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
        assert receiver.stdout is not None
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{receiver.stdout.readline().strip()}"
    try:
        command = [sys.executable, __file__, "--mode", mode, "--requests", str(requests), "--runs", str(runs)]
        out = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        if receiver is not None:
            receiver.terminate()
            receiver.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one mode, in this process
    args = parser.parse_args()
    if args.mode:
        sys.path.insert(0, str(ROOT))
        print(statistics.median(asyncio.run(_measure(args.mode, args.requests, args.runs))))
        return
    figures = {mode: _child(mode, args.requests, args.runs) for mode in MODES}
    print("| tracing | µs per request (median of runs) | vs off |\n|---|---|---|")
    for mode, us in figures.items():
        print(f"| {mode} | {us:.1f} | {us / figures['off'] - 1:+.1%} |")


if __name__ == "__main__":
    main()
