"""Zero-downtime roll-out: version 2 of a model loads and version 1 retires under a bounded concurrent load.

A learned LayerNorm whose versions have different gamma and beta, so that every answer can be checked
against the NumPy reference of the version that says it produced it. In explicit mode the repository
API loads version 2 (a tampered version 3 fails on the way, changing nothing), then a version_policy
of version 2 alone retires version 1; in poll mode the same happens by writing into the folder. Each
run lasts at least 30 s on 127.0.0.1; the figures are printed for the closing note (pytest -s).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.core import reference
from tests.live_server import live_server
from tests.repositories import copy_models, learned_layernorm

pytestmark = pytest.mark.slow

NAME = "ro"
SHAPE = (4, 2, 8)
CONCURRENCY = 8
RUN_S = 32.0  # the issue asks for at least 30 s of load
TOKEN = "rollout-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _weights(version: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(version)
    return (1 + 0.5 * rng.standard_normal((2, 8))).astype(np.float32), rng.standard_normal((2, 8)).astype(np.float32)


def _write_version(root: Path, version: int) -> None:
    """Version `version` written beside the folder, then renamed into place: a scan never sees it half written."""
    tmp = root / ".staging"
    learned_layernorm(tmp, NAME, version, *_weights(version), eps=1e-4)
    (tmp / NAME / str(version)).rename(root / NAME / str(version))


def _policy(root: Path, policy: dict[str, object]) -> None:
    tmp = root / NAME / ".model.json.tmp"
    tmp.write_text(json.dumps({"version_policy": policy}))
    tmp.rename(root / NAME / "model.json")


@dataclass
class Answer:
    sent: float
    done: float
    status: int
    version: str | None
    problem: str | None


@dataclass
class Load:
    answers: list[Answer] = field(default_factory=list)

    def failed(self) -> list[Answer]:
        return [a for a in self.answers if a.problem is not None]

    def versions(self, after: float = 0.0, before: float = float("inf")) -> set[str | None]:
        return {a.version for a in self.answers if a.sent >= after and a.done <= before}


async def _one(client: httpx.AsyncClient, rng: np.random.Generator, load: Load) -> None:
    x = (rng.standard_normal(SHAPE) * 3 + 10).astype(np.float32)
    sent = time.monotonic()
    r = await client.post("/normalize", json={"model": NAME, "data": x.tolist()})
    done = time.monotonic()
    version, problem = None, None
    if r.status_code != 200:
        problem = f"HTTP {r.status_code}: {r.text[:200]}"
    else:
        doc = r.json()
        version = doc["model"]["version"]
        gamma, beta = _weights(int(version))
        ref = reference.layer_norm(x, 2, 1e-4, "var", gamma, beta).output
        diff = float(np.abs(np.asarray(doc["output"]) - ref).max())
        atol = 1e-5 * float(np.abs(gamma).max()) + 2**-23 * float(np.abs(ref).max())
        problem = None if diff <= atol else f"version {version}: max abs diff {diff:.3g} > {atol:.3g}"
    load.answers.append(Answer(sent, done, r.status_code, version, problem))


async def _drive(
    base: str, steps: Callable[[httpx.AsyncClient], Awaitable[dict[str, float]]]
) -> tuple[Load, dict[str, float]]:
    """CONCURRENCY clients for RUN_S seconds while `steps` rolls out; the moments steps reported."""
    load = Load()
    deadline = time.monotonic() + RUN_S

    async def client_loop(seed: int) -> None:
        rng = np.random.default_rng(seed)
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            while time.monotonic() < deadline:
                await _one(client, rng, load)

    async with httpx.AsyncClient(base_url=base, timeout=120, headers=AUTH) as admin:
        loops = [asyncio.create_task(client_loop(i)) for i in range(CONCURRENCY)]
        moments = await steps(admin)
        await asyncio.gather(*loops)
    return load, moments


def _report(mode: str, load: Load, moments: dict[str, float]) -> None:
    start = min(a.sent for a in load.answers)
    first_v2 = min(a.done for a in load.answers if a.version == "2")
    print(
        f"\nroll-out ({mode}): {len(load.answers)} requests, {len(load.failed())} failed; "
        f"v1 answers {sum(a.version == '1' for a in load.answers)}, v2 answers {sum(a.version == '2' for a in load.answers)}; "
        + ", ".join(f"{k} at {v - start:.2f} s" for k, v in moments.items())
        + f"; first v2 answer at {first_v2 - start:.2f} s"
    )


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = copy_models(tmp_path / "models", ("layernorm",))
    (root / NAME).mkdir()
    _write_version(root, 1)
    _policy(root, {"latest": {"num_versions": 2}})
    return root


def test_explicit_roll_out_fails_no_request(repository: Path) -> None:
    env = {
        "NORMSERVE_MODEL_DIR": str(repository),
        "NORMSERVE_MODEL_CONTROL": "explicit",
        "NORMSERVE_ADMIN_TOKEN": TOKEN,
    }

    async def steps(admin: httpx.AsyncClient) -> dict[str, float]:
        moments: dict[str, float] = {}
        await asyncio.sleep(5)
        _write_version(repository, 2)
        moments["load v2 sent"] = time.monotonic()
        r = await admin.post(f"/v2/repository/models/{NAME}/load")
        moments["v2 ready"] = time.monotonic()
        assert (r.status_code, r.json()) == (200, {"name": NAME, "loaded": ["2"], "serving": ["1", "2"]})
        await asyncio.sleep(4)
        _write_version(repository, 3)
        tampered = repository / NAME / "3" / "model.onnx"
        tampered.write_bytes(tampered.read_bytes() + b"\0")
        r = await admin.post(f"/v2/repository/models/{NAME}/load")
        assert r.status_code == 400 and f"{tampered.relative_to(repository)}: sha256 " in r.json()["error"]
        index = (await admin.post("/v2/repository/index")).json()
        states = [(e["version"], e["state"]) for e in index if e["name"] == NAME]
        assert states == [("1", "READY"), ("2", "READY"), ("3", "UNAVAILABLE")]  # what served still serves
        assert f"{tampered.relative_to(repository)}: sha256 " in next(
            e["reason"] for e in index if e["name"] == NAME and e["version"] == "3"
        )
        await asyncio.sleep(4)
        _policy(repository, {"specific": {"versions": [2]}})
        moments["v1 unload sent"] = time.monotonic()
        r = await admin.post(f"/v2/repository/models/{NAME}/load")
        moments["v1 retired"] = time.monotonic()
        assert (r.status_code, r.json()) == (200, {"name": NAME, "loaded": [], "serving": ["2"]})
        return moments

    with live_server(env) as base:
        load, moments = asyncio.run(_drive(base, steps))
    _report("explicit", load, moments)
    assert len(load.answers) > 300 and load.failed() == []
    assert load.versions(before=moments["load v2 sent"]) == {"1"}
    assert load.versions(after=moments["v2 ready"]) == {"2"}  # unpinned requests move once version 2 serves
    assert load.versions(after=moments["v1 retired"]) == {"2"}


def test_poll_roll_out_fails_no_request(repository: Path) -> None:
    env = {
        "NORMSERVE_MODEL_DIR": str(repository),
        "NORMSERVE_MODEL_CONTROL": "poll",
        "NORMSERVE_POLL_INTERVAL_S": "0.5",
    }

    async def steps(admin: httpx.AsyncClient) -> dict[str, float]:
        moments: dict[str, float] = {}
        await asyncio.sleep(5)
        _write_version(repository, 2)
        moments["v2 written"] = time.monotonic()
        while (await admin.get(f"/v2/models/{NAME}/versions/2/ready")).status_code != 200:
            assert time.monotonic() - moments["v2 written"] < 20, "version 2 never became ready"
            await asyncio.sleep(0.05)
        moments["v2 ready"] = time.monotonic()
        await asyncio.sleep(8)
        _policy(repository, {"specific": {"versions": [2]}})
        moments["policy of v2 alone written"] = time.monotonic()
        while (await admin.get(f"/v2/models/{NAME}/versions/1/ready")).status_code == 200:
            assert time.monotonic() - moments["policy of v2 alone written"] < 20, "version 1 never retired"
            await asyncio.sleep(0.05)
        moments["v1 retired"] = time.monotonic()
        return moments

    with live_server(env) as base:
        load, moments = asyncio.run(_drive(base, steps))
    _report("poll", load, moments)
    assert len(load.answers) > 300 and load.failed() == []
    assert load.versions(before=moments["v2 written"]) == {"1"}
    assert load.versions(after=moments["v2 ready"]) == {"2"}
    switch = min(a.done for a in load.answers if a.version == "2")
    assert load.versions(after=switch) == {"2"}  # once one request had version 2, no later one went back
