"""The profiles of the server-side misses: py-spy on a pinned normserve worker, and the worker's own stage timing.

Each runs after the cells it explains (the measured figures never carry a sampler's cost): `pinned_profiles`
samples the pinned normserve worker under the same load as its pinned cell, `v2_stages` reads Triton's
statistics extension and the worker's CPU around FP32 and FP16 V2 binary requests on a fresh worker.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks import servers
from benchmarks.inprocess import sample
from benchmarks.load import Request, check, load
from benchmarks.serving import HALF, make_request

# A stack's layer is that of its innermost frame this table knows (its file path contains the key), so a NumPy
# call inside the kernel check counts as compute and a stdlib frame inside the budget's receive as its caller's.
LAYER_FILES: list[tuple[str, str]] = [
    ("app/core/layernorm.py", "compute"),
    ("app/core/kernels.py", "compute"),
    ("app/core/conditioning.py", "compute"),
    ("app/core/halfprecision.py", "compute"),
    ("app/core/reference.py", "compute"),
    ("onnxruntime/", "compute"),
    ("app/core/jsontensors.py", "decode"),
    ("app/core/jsonkeys.py", "decode"),
    ("app/core/dataplane.py", "decode"),
    ("app/server/http/body.py", "decode"),
    ("app/core/tensors.py", "encode/response"),
    ("app/server/http/responses.py", "encode/response"),
    ("app/server/api/v2/grpc/wire.py", "encode/response"),
    ("app/server/telemetry/", "metrics/logging/tracing"),
    ("prometheus_client/", "metrics/logging/tracing"),
    ("opentelemetry/", "metrics/logging/tracing"),
    ("logging/", "metrics/logging/tracing"),
    ("app/server/", "hot path and middleware"),
    ("uvicorn/", "uvicorn/asyncio"),
    ("asyncio/", "uvicorn/asyncio"),
    ("uvloop/", "uvicorn/asyncio"),
    ("httptools/", "uvicorn/asyncio"),
    ("anyio/", "uvicorn/asyncio"),
    ("starlette/", "uvicorn/asyncio"),
]
LAYERS = [
    "uvicorn/asyncio",
    "hot path and middleware",
    "decode",
    "compute",
    "encode/response",
    "metrics/logging/tracing",
    "other",
]
CODEC = "codec.py"  # a codec frame's layer: its (or its caller's) direction
TOP = 8
STAGES = ("queue", "compute_input", "compute_infer", "compute_output")  # Triton's names, its statistics' order


def frame_parts(frame: str) -> tuple[str, str]:
    """(function, file) of a py-spy raw frame `function (file:line)`; the file without its line number."""
    name, _, where = frame.rpartition(" (")
    return (name or frame), where.rstrip(")").rsplit(":", 1)[0]


def layer_of(stack: list[str]) -> str:
    """The layer of a stack (root first): that of its innermost frame LAYER_FILES or a codec names, else other."""
    for i in range(len(stack) - 1, -1, -1):
        function, path = frame_parts(stack[i])
        if path.endswith(CODEC):
            return _direction(stack[: i + 1])
        for key, layer in LAYER_FILES:
            if key in path:
                return layer
    return "other"


def _direction(stack: list[str]) -> str:
    """A codec frame's layer: decode or encode, as the nearest function that names one (a helper's caller)."""
    for frame in reversed(stack):
        function = frame_parts(frame)[0].lower()
        if "decode" in function:  # before encode: /encode's own decode is decode_encode
            return "decode"
        if "encode" in function:
            return "encode/response"
    return "decode"


def summarize(raw: str) -> dict[str, Any]:
    """py-spy's raw output (`frame;frame;... count` per line) as the share of samples per layer and the top
    functions by self time (the innermost frame's samples), each with its share."""
    layers: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for line in raw.splitlines():
        stack_text, _, count = line.rpartition(" ")
        if not stack_text or not count.isdigit():
            continue
        stack = stack_text.split(";")
        layers[layer_of(stack)] += int(count)
        function, path = frame_parts(stack[-1])
        own[f"{function} ({path})"] += int(count)
    total = sum(layers.values())
    if not total:
        return {"samples": 0, "layers": {}, "top": []}
    shares = {layer: layers[layer] / total for layer in LAYERS if layers[layer]}
    top = [[name, n / total] for name, n in own.most_common(TOP)]
    return {"samples": total, "layers": shares, "top": top}


def py_spy() -> str | None:
    """The py-spy beside this Python (the venv's) or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def record(pid: int, port: int, request: Request, concurrency: int, seconds: int, rate: int) -> dict[str, Any]:
    """py-spy on the server's process for whole `seconds` (its -d) while the load runs: its summary, or why
    there is none (never raises)."""
    exe = py_spy()
    if exe is None:
        return {"error": "py-spy is not installed (the test extra has it)"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "profile.raw"
        cmd = [exe, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate)]
        cmd += ["-d", str(seconds), "--nonblocking", "-o", str(out)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        load(port, request, concurrency, seconds + 0.5)  # the load outlasts the sampling
        try:
            _, err = proc.communicate(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return {"error": "py-spy did not finish"}
        if proc.returncode != 0 or not out.is_file():
            return {"error": f"py-spy could not sample the worker (exit {proc.returncode}): {_reason(err)}"}
        return summarize(out.read_text())


def _reason(stderr: str) -> str:
    """py-spy's error line (`Error: ...`, before its backtrace), or its last line."""
    lines = stderr.strip().splitlines() or ["no message"]
    return next((ln.removeprefix("Error: ") for ln in lines if ln.startswith("Error: ")), lines[-1])


def pinned_profiles(
    cases: list[tuple[tuple[int, ...], int, int, int, Request]], seconds: float, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """One py-spy pass per (shape, concurrency, pid, port, request) of the pinned normserve cells."""
    rows, whole = [], max(1, round(seconds))  # py-spy samples for whole seconds
    for shape, conc, pid, port, request in cases:
        summary = record(pid, port, request, conc, whole, rate=200)
        rows.append({"shape": shape, "concurrency": conc, "seconds": whole, **summary})
        log(f"profile {shape!s:15} c={conc:<3} " + (summary.get("error") or f"{summary['samples']} samples"))
    return rows


def _stage_ns(port: int) -> dict[str, float]:
    """The layernorm model's cumulative ns per stage and its success count, from /v2/models/layernorm/stats."""
    body = httpx.get(f"http://127.0.0.1:{port}/v2/models/layernorm/stats", timeout=30).json()
    stats = body["model_stats"][0]["inference_stats"]
    return {"count": float(stats["success"]["count"]), **{s: float(stats[s]["ns"]) for s in STAGES}}


def v2_stages(shape: tuple[int, ...], requests: int, rounds: int = 5) -> list[dict[str, Any]]:
    """Per request, the worker's own ms in each stage for FP32 and FP16 V2 binary of x: the differences of its
    statistics around sequential requests of each, `requests` in all per datatype, in interleaved rounds (a
    neighbour's load on a shared machine falls on both alike); one checked request of each warms it up."""
    x, protocols = sample(shape), ("V2 binary", HALF)
    sums = {p: dict.fromkeys(("count", "server_ns", *STAGES), 0.0) for p in protocols}
    with servers.serve("normserve") as srv:
        wanted = {p: make_request(p, x) for p in protocols}
        for request in wanted.values():
            check(srv.port, request)
        for round_ in range(rounds):
            for protocol, request in wanted.items():
                before, cpu = _stage_ns(srv.port), servers.cpu_seconds(srv.pid)
                n = requests // rounds + (round_ < requests % rounds)
                load(srv.port, request, 1, 120.0, max_requests=n)
                cpu = servers.cpu_seconds(srv.pid) - cpu  # the worker's (every thread), read before the stats' GET
                after = {**_stage_ns(srv.port), "server_ns": cpu * 1e9}
                for key in sums[protocol]:
                    sums[protocol][key] += after[key] - before.get(key, 0.0)
    return [
        {
            "protocol": p,
            "shape": shape,
            "requests": sums[p]["count"],
            "server_ms": sums[p]["server_ns"] / sums[p]["count"] / 1e6,
            "stage_ms": {s: sums[p][s] / sums[p]["count"] / 1e6 for s in STAGES},
        }
        for p in protocols
    ]
