"""Server processes on 127.0.0.1, started and stopped by PID: the one helper of the benchmarks and of the tests.

`server_process` starts any command (uvicorn from this venv or another, `normserve serve`, a peer), waits until a
path answers 200 and stops that process alone on exit; `serve` starts normserve or one of the benchmark's peers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".bench"  # gitignored: the peers' venvs and the servers' logs
# The peers that run in a venv of their own under CACHE, never in ours: what pip installs there.
PEER_PACKAGES = {
    "kserve": ["kserve", "onnxruntime", "numpy"],
    "mlserver": ["mlserver==1.7.1", "onnxruntime", "numpy"],
}
HOST = "127.0.0.1"
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Server:
    """A running server: its base URL (http://127.0.0.1:PORT) and its process."""

    base: str
    proc: subprocess.Popen[bytes]

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    @property
    def pid(self) -> int:
        return self.proc.pid


def free_port() -> int:
    """A loopback port free right now, for a command that cannot take an --fd socket (a peer, `normserve serve`)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def bound_socket() -> socket.socket:
    """A TCP socket bound here on 127.0.0.1, port 0, for uvicorn's --fd: no other process can take its port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # uvicorn takes an --fd socket for AF_UNIX, so asyncio never sets TCP_NODELAY on its connections; set on
    # the listener, Linux passes it on to each accepted one (without it, keep-alive requests wait ~40 ms).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((HOST, 0))
    return sock


def uvicorn_command(*options: str, python: str = sys.executable, app: str = "app.main:app") -> list[str]:
    """`PYTHON -m uvicorn APP OPTIONS`: a command for server_process's --fd mode (it adds `--fd N`)."""
    return [python, "-m", "uvicorn", app, *options]


@contextmanager
def server_process(
    command: Sequence[str],
    *,
    port: int | None = None,
    ready: str = "/v2/health/ready",
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    timeout: float = READY_TIMEOUT_S,
    stop_timeout: float = STOP_TIMEOUT_S,
    output: Path | None = None,
) -> Iterator[Server]:
    """Run `command + args` on 127.0.0.1, wait until GET `ready` answers 200, yield it; on exit stop its PID alone.

    port None: the command is a uvicorn command line; it gets `--fd N`, a socket bound here (see bound_socket).
    port given: the command listens on that port itself (from free_port(), in its arguments or its env).
    env is the child's whole environment (None: this one's); output, if given, gets its stdout and stderr appended.
    """
    sock = bound_socket() if port is None else None
    cmd, fds = [*command, *args], list[int]()
    if sock is not None:
        port, fds = int(sock.getsockname()[1]), [sock.fileno()]
        cmd += ["--fd", str(sock.fileno())]
    log = output.open("ab") if output is not None else None
    stderr = None if log is None else subprocess.STDOUT
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, pass_fds=fds, stdout=log, stderr=stderr)
    finally:  # the child holds its own copies of both
        if sock is not None:
            sock.close()
        if log is not None:
            log.close()
    server = Server(f"http://{HOST}:{port}", proc)
    try:
        _wait_ok(server, ready, timeout, output)
        yield server
    finally:
        stop(proc, stop_timeout)


def stop(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds: only the process this run started, by its PID."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ok(server: Server, path: str, timeout: float, output: Path | None) -> None:
    url = server.base + path
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode} before {url} answered 200{_tail(output)}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200 within {timeout} s{_tail(output)}")


def _tail(output: Path | None, chars: int = 4000) -> str:
    return "" if output is None else f"; the end of {output}:\n{output.read_text(errors='replace')[-chars:]}"


def normserve_command(app: str = "app.main:app") -> list[str]:
    # One uvicorn process (no --workers): its PID is the worker's, whose memory section 5 reads.
    options = ("--loop", "uvloop", "--http", "httptools", "--log-level", "warning", "--no-access-log")
    return uvicorn_command(*options, app=app)


def layernorm_path(models: Path) -> Path:
    """The layernorm ONNX file of the repository layout models/layernorm/<version>/model.onnx, newest version."""
    versions = [d for d in (models / "layernorm").iterdir() if d.name.isdigit() and (d / "model.onnx").is_file()]
    if not versions:
        raise FileNotFoundError(f"no models/layernorm/<version>/model.onnx under {models}")
    return max(versions, key=lambda d: int(d.name)) / "model.onnx"


def _command(name: str, models: Path, port: int | None, grpc_port: int) -> tuple[list[str], str]:
    """The command line of one server and the path that answers 200 once it is ready."""
    layernorm = str(layernorm_path(models))
    if name == "normserve":
        return normserve_command(), "/v2/health/ready"
    if name == "trivial":  # the HTTP floor: the same uvicorn, uvloop and httptools, no framework, no work
        return normserve_command("benchmarks.peers.trivial_asgi:app"), "/health"
    if name == "naive":
        cmd = [sys.executable, "-m", "benchmarks.peers.naive_fastapi", "--model", layernorm, "--port", str(port)]
        return cmd, "/health"
    if name == "kserve":
        cmd = [str(peer_venv(name) / "bin" / "python"), str(ROOT / "benchmarks/peers/kserve_model.py")]
        cmd += ["--model_path", layernorm, "--http_port", str(port)]
        return cmd + (["--grpc_port", str(grpc_port)] if grpc_port else []), "/v2/models/layernorm/ready"
    if name == "mlserver":
        cmd = [str(peer_venv(name) / "bin" / "python"), str(ROOT / "benchmarks/peers/mlserver_model.py")]
        cmd += ["--model_path", layernorm, "--http_port", str(port)]
        # MLServer always starts its gRPC and metrics servers: both get a free loopback port.
        cmd += ["--grpc_port", str(grpc_port or free_port()), "--metrics_port", str(free_port())]
        return cmd, "/v2/models/layernorm/ready"
    raise ValueError(f"unknown server {name!r}")


@contextmanager
def serve(
    name: str,
    env: Mapping[str, str] | None = None,
    model_dir: Path | None = None,
    grpc_port: int = 0,
    pin: int | None = None,
) -> Iterator[Server]:
    """Start one server (normserve, trivial, naive, kserve or mlserver), wait until it answers ready, stop it on exit.

    grpc_port: normserve and the V2 peers also serve gRPC there (0: no gRPC; never 8001, which a second server
    could not take). pin: the one core the server runs on (`taskset -c`), its threads and children with it."""
    models = model_dir or ROOT / "models"
    base = {"NORMSERVE_MODEL_DIR": str(models), "NORMSERVE_LOG_LEVEL": "warning", "NORMSERVE_GRPC_PORT": str(grpc_port)}
    full_env = {**os.environ, **base, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if name == "kserve":
        full_env["KSERVE_LOGLEVEL"] = "WARNING"  # no log line per request, as normserve at warning
    port = None if name in ("normserve", "trivial") else free_port()  # the peers take a port, not an --fd socket
    cmd, ready = _command(name, models, port, grpc_port)
    if pin is not None:
        cmd = ["taskset", "-c", str(pin), *cmd]  # taskset execs the command: the PID stays the server's
    CACHE.mkdir(exist_ok=True)
    with server_process(cmd, port=port, ready=ready, env=full_env, output=CACHE / f"{name}.log") as server:
        yield server


def peer_venv(name: str) -> Path:
    return CACHE / f"{name}-venv"


def peer_ready(name: str) -> bool:
    return (peer_venv(name) / ".installed").is_file()


def ensure_peer_venv(name: str, timeout_s: float = 1200.0) -> None:
    """Create .bench/NAME-venv with pip install PEER_PACKAGES[name], once; a peer never enters our venv."""
    if peer_ready(name):
        return
    CACHE.mkdir(exist_ok=True)
    venv, packages = peer_venv(name), PEER_PACKAGES[name]
    print(f"bench: creating {venv} (pip install {' '.join(packages)}) ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=timeout_s)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *packages]
    subprocess.run(pip, check=True, timeout=timeout_s)
    (venv / ".installed").write_text(peer_version(name) + "\n")


def peer_version(name: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({name!r}))"
    python = str(peer_venv(name) / "bin" / "python")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
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
