"""The servers a benchmark run starts and stops itself, by PID, on 127.0.0.1: normserve and the two peers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".bench"  # gitignored: the KServe venv and the servers' logs
KSERVE_VENV = CACHE / "kserve-venv"
KSERVE_PACKAGES = ["kserve", "onnxruntime", "numpy"]
READY_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Server:
    name: str
    port: int
    pid: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def normserve_command(port: int) -> list[str]:
    # One uvicorn process (no --workers): its PID is the worker's, whose memory section 5 reads.
    return [
        *(sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port)),
        *("--loop", "uvloop", "--http", "httptools", "--log-level", "warning", "--no-access-log"),
    ]


@contextmanager
def serve(name: str, env: Mapping[str, str] | None = None, model_dir: Path | None = None) -> Iterator[Server]:
    """Start one server (normserve, naive or kserve), wait until it answers ready, stop it on exit."""
    port = free_port()
    models = model_dir or ROOT / "models"
    full_env = {**os.environ, "NORMSERVE_MODEL_DIR": str(models), "NORMSERVE_LOG_LEVEL": "warning", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    layernorm = str(models / "layernorm.onnx")
    if name == "normserve":
        cmd, ready = normserve_command(port), "/v2/health/ready"
    elif name == "naive":
        cmd = [sys.executable, "-m", "benchmarks.peers.naive_fastapi", "--model", layernorm, "--port", str(port)]
        ready = "/health"
    elif name == "kserve":
        cmd = [str(KSERVE_VENV / "bin" / "python"), str(ROOT / "benchmarks/peers/kserve_model.py")]
        cmd += ["--model_path", layernorm, "--http_port", str(port)]
        full_env["KSERVE_LOGLEVEL"] = "WARNING"  # no log line per request, as normserve at warning
        ready = "/v2/models/layernorm/ready"
    else:
        raise ValueError(f"unknown server {name!r}")
    CACHE.mkdir(exist_ok=True)
    log = (CACHE / f"{name}.log").open("ab")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(f"http://127.0.0.1:{port}{ready}", proc, name)
        yield Server(name, port, proc.pid)
    finally:
        stop(proc)
        log.close()


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 15 s: only the process this run started."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before {url} answered; see {CACHE / name}.log")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{name}: {url} did not answer 200 within {READY_TIMEOUT_S} s")


def kserve_ready() -> bool:
    return (KSERVE_VENV / ".installed").is_file()


def ensure_kserve_venv(timeout_s: float = 1200.0) -> None:
    """Create .bench/kserve-venv with `pip install kserve onnxruntime numpy`, once; KServe never enters our venv."""
    if kserve_ready():
        return
    CACHE.mkdir(exist_ok=True)
    print(f"bench: creating {KSERVE_VENV} (pip install {' '.join(KSERVE_PACKAGES)}) ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(KSERVE_VENV)], check=True, timeout=timeout_s)
    pip = [str(KSERVE_VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", *KSERVE_PACKAGES]
    subprocess.run(pip, check=True, timeout=timeout_s)
    (KSERVE_VENV / ".installed").write_text(kserve_version() + "\n")


def kserve_version() -> str:
    code = "import importlib.metadata as m; print(m.version('kserve'))"
    out = subprocess.run([str(KSERVE_VENV / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or "unknown"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/PID/stat): robust to other load on a shared machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in KiB, from /proc/PID/status."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields
