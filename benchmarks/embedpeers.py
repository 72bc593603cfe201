"""The embeddings section's servers: sentence-transformers behind FastAPI, Infinity (its own venv), normserve; each
pinned to one core, asked once through httpx to check its embeddings against the floor's."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import orjson

from benchmarks import servers
from benchmarks.embedrows import INFINITY, INFINITY_PACKAGES, NORMSERVE, NORMSERVE_INT8, ST, EmbeddingsPlan
from benchmarks.load import LOOPBACK, Request


def infinity_venv() -> Path:
    return servers.peer_venv("infinity")


def ensure_infinity(log: Callable[[str], None], timeout_s: float = 1200.0) -> str | None:
    """Infinity's venv, created once like MLServer's; None when ready, else why its row is left out (an install
    that fails, or one that brings a torch other than the CPU build ours has)."""
    venv = infinity_venv()
    if not (venv / ".installed").is_file():
        servers.CACHE.mkdir(exist_ok=True)
        log(f"creating {venv} (pip install {' '.join(INFINITY_PACKAGES)}) ...")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=timeout_s)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *INFINITY_PACKAGES]
        done = subprocess.run(pip, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            return f"pip install {' '.join(INFINITY_PACKAGES)} failed: {done.stderr.strip()[-300:]}"
        (venv / ".installed").write_text(_venv_version(venv, "infinity_emb") + "\n")
    theirs = _venv_version(venv, "torch")
    if "+cpu" not in theirs:
        return f"its install brought torch {theirs}, not a CPU build: left out"
    return None


def _venv_version(venv: Path, dist: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or "unknown"


@dataclass(frozen=True)
class Running:
    name: str
    server: servers.Server
    path: str  # the embeddings route
    model: str  # the model name the request carries


@contextmanager
def start(name: str, plan: EmbeddingsPlan, repo: Path, core: int) -> Iterator[Running]:
    """One server pinned to `core`, its threads to one (OMP_NUM_THREADS, torch's and onnxruntime's setting)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join([str(servers.ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    pin = ["taskset", "-c", str(core)]
    log = servers.CACHE / f"embeddings-{name.replace(' ', '-')}.log"
    if name in (NORMSERVE, NORMSERVE_INT8):
        env |= {"NORMSERVE_MODEL_DIR": str(repo), "NORMSERVE_LOG_LEVEL": "warning", "NORMSERVE_GRPC_PORT": "0"}
        env["NORMSERVE_INTRA_OP_THREADS"] = "1"
        command = [*pin, *servers.normserve_command()]
        with servers.server_process(command, ready="/v2/health/ready", env=env, output=log) as srv:
            yield Running(name, srv, "/v1/embeddings", "minilm-int8" if name == NORMSERVE_INT8 else "minilm")
        return
    port = servers.free_port()
    if name == ST:
        cmd = [sys.executable, "-m", "benchmarks.peers.st_fastapi", "--model", str(plan.model_path)]
        cmd += ["--port", str(port)]
        path, model = "/v1/embeddings", "minilm"
    elif name == INFINITY:
        cmd = [str(infinity_venv() / "bin" / "infinity_emb"), "v2", "--model-id", str(plan.model_path)]
        cmd += ["--engine", "torch", "--device", "cpu", "--port", str(port), "--host", LOOPBACK]
        path, model = "/embeddings", str(plan.model_path)
    else:
        raise ValueError(f"unknown embeddings server {name!r}")
    with servers.server_process([*pin, *cmd], port=port, ready="/health", env=env, output=log) as srv:
        yield Running(name, srv, path, model)


def request(running: Running, group: Sequence[str]) -> Request:
    body = orjson.dumps({"model": running.model, "input": list(group)})
    return Request(running.path, body, {"Content-Type": "application/json"})


def answer(running: Running, group: Sequence[str]) -> tuple[int, np.ndarray | None]:
    """One request through httpx: its status, and its embeddings when 200."""
    url = running.server.base + running.path
    headers = {"Content-Type": "application/json"}
    response = httpx.post(url, content=request(running, group).body, headers=headers, timeout=120)
    if response.status_code != 200:
        return response.status_code, None
    data = sorted(response.json()["data"], key=lambda d: d["index"])
    return 200, np.array([d["embedding"] for d in data], dtype=np.float32)


def worst_cosine(got: np.ndarray, want: np.ndarray) -> float:
    num = (got * want).sum(axis=1)
    return float((num / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))).min())
