"""Explicit model control with several workers, under load: a load or unload applies to every worker before it answers.

`normserve serve --workers N` in explicit mode serves the learned LayerNorm of test_rollout.py (versions with
different gamma and beta). Eight clients, four over HTTP and four over gRPC, each opening a new connection every
RECONNECT requests so that every worker takes some, check every answer against the NumPy reference of the version
it names. Meanwhile the repository API (over HTTP, or over gRPC) loads version 2, fails to load a tampered version
3, retires version 1 and unloads another model; after each answer, probes on new connections see the same thing
on whichever worker answers them, index included.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from app.core import reference
from app.core.model import sha256_of
from benchmarks.servers import HOST, free_port
from tests.cli.normserve import NORMSERVE
from tests.grpc_loadgen import INFER, request
from tests.live_server import cli_server
from tests.repositories import copy_models
from tests.server.test_modelsync import AUTH, TOKEN, all_started, index, versions
from tests.suites.test_rollout import NAME, SHAPE, Answer, Load, _policy, _weights, _write_version

pytestmark = pytest.mark.slow

CLIENTS = 8  # half over HTTP, half over gRPC
TAIL_S = 3.0  # of load after the last step
RECONNECT = 10  # requests per connection: a new connection may land on any worker


def _judge(x: np.ndarray, version: str, output: np.ndarray) -> str | None:
    gamma, beta = _weights(int(version))
    ref = reference.layer_norm(x, 2, 1e-4, "var", gamma, beta).output
    diff = float(np.abs(output - ref).max())
    atol = 1e-5 * float(np.abs(gamma).max()) + 2**-23 * float(np.abs(ref).max())
    return None if diff <= atol else f"version {version}: max abs diff {diff:.3g} > {atol:.3g}"


async def _http_client(base: str, seed: int, done: asyncio.Event, load: Load) -> None:
    rng = np.random.default_rng(seed)
    while not done.is_set():
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            for _ in range(RECONNECT):
                x = (rng.standard_normal(SHAPE) * 3 + 10).astype(np.float32)
                sent = time.monotonic()
                r = await client.post("/normalize", json={"model": NAME, "data": x.tolist()})
                version, problem = None, f"HTTP {r.status_code}: {r.text[:200]}"
                if r.status_code == 200:
                    version = r.json()["model"]["version"]
                    problem = _judge(x, version, np.asarray(r.json()["output"], np.float32))
                load.answers.append(Answer(sent, time.monotonic(), r.status_code, version, problem))


async def _grpc_client(address: str, seed: int, done: asyncio.Event, load: Load) -> None:
    rng = np.random.default_rng(seed)
    while not done.is_set():
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.unary_unary(INFER, response_deserializer=pb.ModelInferResponse.FromString)
            for _ in range(RECONNECT):
                x = (rng.standard_normal(SHAPE) * 3 + 10).astype(np.float32)
                sent = time.monotonic()
                try:
                    response = await call(request(NAME, [("input", x)]).SerializeToString(), timeout=30)
                except grpc.aio.AioRpcError as e:
                    load.answers.append(Answer(sent, time.monotonic(), 0, None, f"{e.code().name}: {e.details()}"))
                    continue
                version = response.model_version
                output = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(SHAPE)
                load.answers.append(Answer(sent, time.monotonic(), 200, version, _judge(x, version, output)))


class Admin:
    """The repository API over HTTP or gRPC, and probes on new connections of what every worker serves."""

    def __init__(self, base: str, address: str, transport: str) -> None:
        self.base, self.address, self.transport = base, address, transport

    async def control(self, action: str, name: str) -> tuple[int, str]:
        """(HTTP status, or 200/400 for gRPC's OK/INVALID_ARGUMENT, and the error message or "")."""
        if self.transport == "http":
            async with httpx.AsyncClient(base_url=self.base, timeout=120, headers=AUTH) as admin:
                r = await admin.post(f"/v2/repository/models/{name}/{action}")
            return r.status_code, r.json().get("error", "")
        return await asyncio.to_thread(self._grpc_control, action, name)

    def _grpc_control(self, action: str, name: str) -> tuple[int, str]:
        client = grpcclient.InferenceServerClient(self.address)
        try:
            getattr(client, f"{action}_model")(name, headers={"authorization": f"Bearer {TOKEN}"})
        except InferenceServerException as e:
            return (400 if e.status() == "StatusCode.INVALID_ARGUMENT" else 500), e.message() or ""
        finally:
            client.close()
        return 200, ""

    async def versions(self, name: str) -> set[tuple[int, tuple[str, ...]]]:
        return await asyncio.to_thread(versions, self.base, name)

    async def index(self) -> list[tuple[str, str, str, str]]:
        return await asyncio.to_thread(index, self.base)


async def _roll_out(repository: Path, admin: Admin) -> dict[str, float]:
    moments: dict[str, float] = {}
    await asyncio.sleep(3)
    _write_version(repository, 2)
    moments["load v2 sent"] = time.monotonic()
    assert await admin.control("load", NAME) == (200, "")
    moments["v2 ready"] = time.monotonic()
    assert await admin.versions(NAME) == {(200, ("1", "2"))}
    assert await admin.index() == [
        ("layernorm", "1", "READY", ""),
        (NAME, "1", "READY", ""),
        (NAME, "2", "READY", ""),
    ]
    await asyncio.sleep(2)
    _write_version(repository, 3)
    tampered = repository / NAME / "3" / "model.onnx"
    tampered.write_bytes(tampered.read_bytes() + b"\0")
    listed = json.loads((tampered.parent / "manifest.json").read_text())["files"]["model.onnx"]
    reason = f"{tampered.relative_to(repository)}: sha256 {sha256_of(tampered)} does not match the manifest's {listed}"
    assert await admin.control("load", NAME) == (400, f"failed to load model {NAME!r}: {reason}")
    assert await admin.versions(NAME) == {(200, ("1", "2"))}  # nothing changed on any worker
    assert (await admin.index())[1:] == [
        (NAME, "1", "READY", ""),
        (NAME, "2", "READY", ""),
        (NAME, "3", "UNAVAILABLE", reason),  # the same reason from every worker
    ]
    await asyncio.sleep(2)
    _policy(repository, {"specific": {"versions": [2]}})
    moments["v1 retire sent"] = time.monotonic()
    assert await admin.control("load", NAME) == (200, "")
    moments["v1 retired"] = time.monotonic()
    assert await admin.versions(NAME) == {(200, ("2",))}
    assert await admin.control("unload", "layernorm") == (200, "")
    assert {s for s, _ in await admin.versions("layernorm")} == {404}
    assert (await admin.index())[0] == ("layernorm", "1", "UNAVAILABLE", "unloaded")
    await asyncio.sleep(2)
    return moments


async def _drive(base: str, address: str, transport: str, repository: Path) -> tuple[Load, dict[str, float]]:
    load, done = Load(), asyncio.Event()
    clients: list[Coroutine[Any, Any, None]] = [
        (_http_client(base, i, done, load) if i % 2 else _grpc_client(address, i, done, load)) for i in range(CLIENTS)
    ]
    tasks = [asyncio.create_task(c) for c in clients]
    moments = await _roll_out(repository, Admin(base, address, transport))
    await asyncio.sleep(TAIL_S)
    done.set()
    await asyncio.gather(*tasks)
    return load, moments


@pytest.mark.parametrize(("workers", "transport"), [(2, "http"), (3, "grpc")])
def test_a_load_or_unload_applies_to_every_worker_before_it_answers(
    tmp_path: Path, workers: int, transport: str
) -> None:
    repository = copy_models(tmp_path / "models", ("layernorm",))
    (repository / NAME).mkdir()
    _write_version(repository, 1)
    _policy(repository, {"latest": {"num_versions": 2}})
    grpc_port = free_port()
    env = {
        **os.environ,
        "NORMSERVE_MODEL_DIR": str(repository),
        "NORMSERVE_MODEL_CONTROL": "explicit",
        "NORMSERVE_ADMIN_TOKEN": TOKEN,
        "NORMSERVE_GRPC_PORT": str(grpc_port),
        "NORMSERVE_LOG_LEVEL": "warning",
    }
    with cli_server([str(NORMSERVE), "serve", "--workers", str(workers)], env) as server:
        all_started(server, workers)
        load, moments = asyncio.run(_drive(server.base, f"{HOST}:{grpc_port}", transport, repository))
    failed = load.failed()
    start = min(a.sent for a in load.answers)
    print(
        f"\nexplicit control, {workers} workers, control over {transport}: {len(load.answers)} requests, "
        f"{len(failed)} failed; " + ", ".join(f"{k} at {v - start:.2f} s" for k, v in moments.items())
    )
    assert len(load.answers) > 300 and failed == []
    assert load.versions(before=moments["load v2 sent"]) == {"1"}
    assert load.versions(after=moments["v2 ready"]) == {"2"}  # on every worker once the load answered
    assert load.versions(after=moments["v1 retired"]) == {"2"}
