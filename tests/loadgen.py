"""A bounded load generator for the load, drain and failover tests: mixed requests, each checked against app.reference.

The Tally and the failover tests' closing checks serve the gRPC load generator (tests/grpc_loadgen.py) too.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import httpx
import numpy as np

from app.core import reference
from app.core.runtime import Runtime

JSON = {"Content-Type": "application/json"}
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class Case:
    """One request and what its answer must be: `check` returns None when the answer is right, else why not."""

    name: str
    path: str
    body: bytes
    headers: dict[str, str]
    valid: bool
    check: Callable[[httpx.Response], str | None]


@dataclass
class Outcome:
    case: str
    valid: bool
    sent: float  # time.monotonic() when sent
    done: float
    status: int | None  # None: no HTTP answer (transport error)
    problem: str | None  # a wrong answer, or the transport error

    def counted(self) -> dict[str, bool]:
        """What the Tally's summary counts of an HTTP answer beyond its case's verdict."""
        return {
            "5xx_on_valid": self.valid and self.status is not None and self.status >= 500,
            "transport_errors": self.status is None,
        }


class Judged(Protocol):
    """An outcome as the Tally reads it: an HTTP Outcome or a gRPC one."""

    valid: bool
    sent: float
    problem: str | None

    def counted(self) -> dict[str, bool]: ...


OutcomeT = TypeVar("OutcomeT", bound=Judged)


@dataclass
class Tally(Generic[OutcomeT]):
    outcomes: list[OutcomeT] = field(default_factory=list)

    def failures(self, valid: bool = True) -> list[OutcomeT]:
        """Outcomes of valid (or invalid) requests that were not answered as their case requires."""
        return [o for o in self.outcomes if o.valid == valid and o.problem is not None]

    def summary(self) -> dict[str, int]:
        valid = [o for o in self.outcomes if o.valid]
        counts = {
            "sent": len(self.outcomes),
            "valid": len(valid),
            "invalid": len(self.outcomes) - len(valid),
            "failed": sum(o.problem is not None for o in self.outcomes),
        }
        for outcome in self.outcomes:
            for name, hit in outcome.counted().items():
                counts[name] = counts.get(name, 0) + hit
        return counts


def assert_survived(tally: Tally[Any], killed_at: float, title: str, note: str = "") -> None:
    """The closing checks of a failover test: every answer as its case requires, and load on both sides of the kill
    (the summary printed first, titled, with the test's own note)."""
    after = [o for o in tally.outcomes if o.sent > killed_at]
    summary = tally.summary()
    print(f"\n{title}: {summary}, sent after the kill {len(after)}{note}")
    assert tally.failures(valid=True) == [], tally.failures(valid=True)[:5]
    assert tally.failures(valid=False) == [], tally.failures(valid=False)[:5]
    assert summary["valid"] > 100 and len(after) > 50, summary


def _close(got: Any, want: np.ndarray, atol: float) -> str | None:
    arr = np.asarray(got, dtype=np.float64).reshape(want.shape)
    diff = float(np.max(np.abs(arr - want))) if arr.size else 0.0
    return None if diff <= atol else f"max abs diff {diff:.3g} > {atol:.3g}"


def _expect_json(status: int, extract: Callable[[Any], Any], want: np.ndarray, atol: float) -> Callable[..., Any]:
    def check(r: httpx.Response) -> str | None:
        if r.status_code != status:
            return f"status {r.status_code}: {r.text[:200]}"
        return _close(extract(r.json()), want, atol)

    return check


def _expect_error(status: int, message: str) -> Callable[[httpx.Response], str | None]:
    def check(r: httpx.Response) -> str | None:
        if r.status_code != status:
            return f"status {r.status_code}, expected {status}: {r.text[:200]}"
        if r.json().get("error") != message:
            return f"error {r.json()!r}, expected {message!r}"
        return None

    return check


def normalize_case(rng: np.random.Generator, shape: tuple[int, ...], k: int, eps_mode: str) -> Case:
    """A /normalize request with an offset and scale per call, and its float64 answer."""
    x = (rng.standard_normal(shape) * rng.uniform(0.1, 100) + rng.uniform(-1e3, 1e3)).astype(np.float32)
    gamma = rng.uniform(0.5, 2, shape[-k:]).astype(np.float32)
    beta = rng.uniform(-1, 1, shape[-k:]).astype(np.float32)
    ref = reference.layer_norm(x, k, 1e-5, eps_mode, gamma, beta)
    doc = {"data": x.tolist(), "normalized_shape": list(shape[-k:]), "eps_mode": eps_mode}
    doc |= {"gamma": gamma.tolist(), "beta": beta.tolist()}
    atol = 1e-5 * float(np.abs(gamma).max()) + 1e-6
    check = _expect_json(200, lambda d: d["output"], ref.output, atol)
    return Case(f"normalize{list(shape)}-k{k}-{eps_mode}", "/normalize", json.dumps(doc).encode(), JSON, True, check)


def v2_layernorm_case(rng: np.random.Generator, rows: int, cols: int, binary: bool) -> Case:
    """A V2 infer on layernorm, JSON or binary (as tritonclient sends it), with its float64 answer."""
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    ref = reference.layer_norm(x, 1)
    tensor: dict[str, Any] = {"name": "input", "shape": [rows, cols], "datatype": "FP32"}
    if binary:
        tensor["parameters"] = {"binary_data_size": x.nbytes}
        head = json.dumps({"inputs": [tensor], "outputs": [{"name": "output"}]}).encode()
        body, headers = head + x.tobytes(), {HEADER_LENGTH: str(len(head))}
    else:
        tensor["data"] = x.ravel().tolist()
        body, headers = json.dumps({"inputs": [tensor], "outputs": [{"name": "output"}]}).encode(), JSON
    check = _expect_json(200, lambda d: d["outputs"][0]["data"], ref.output, 1e-5)
    return Case(
        f"v2-layernorm-{'binary' if binary else 'json'}", "/v2/models/layernorm/infer", body, headers, True, check
    )


def encode_case(runtime: Runtime, rng: np.random.Generator, model: str, batch: int, seq: int) -> Case:
    """An /encode request with a padded last position, checked against the float64 encoder."""
    m = runtime.get(model)
    assert m.config is not None and m.weights is not None
    x = rng.standard_normal((batch, seq, m.config.d_model)).astype(np.float32)
    mask = np.zeros((batch, seq), dtype=bool)
    mask[:, -1] = seq > 1
    ref, _ = reference.encoder(x, m.weights, m.config, mask)
    doc = {"data": x.tolist(), "padding_mask": mask.tolist(), "model": model}
    check = _expect_json(200, lambda d: d["output"], ref, 1e-4)
    return Case(f"encode-{model}[{batch},{seq}]", "/encode", json.dumps(doc).encode(), JSON, True, check)


def invalid_cases() -> list[Case]:
    """Bad requests whose answers are fixed 4xx: the load mixes them in with the valid ones."""
    bad_header = json.dumps({"inputs": [{"name": "input", "shape": [2], "datatype": "FP32"}]}).encode()
    rows = [
        ("ragged", "/normalize", b'{"data": [[1, 2], [3]]}', JSON, 422, "data: row 1 has 1 elements, expected 2"),
        (
            "nan-token",
            "/normalize",
            b'{"data": [NaN, 1]}',
            JSON,
            400,
            "body: not valid JSON (unexpected character, expected a JSON value: line 1 column 11 (char 10))",
        ),
        (
            "wrong-d-model",
            "/encode",
            b'{"data": [[1, 2]]}',
            JSON,
            422,
            "data: last dimension is 2, expected d_model = 128 (model 'encoder', version 1)",
        ),
        (
            "unknown-model",
            "/v2/models/gpt/infer",
            b"{}",
            JSON,
            404,
            "model: unknown model 'gpt'; available: encoder, encoder-preln, layernorm",
        ),
        (
            "v2-float32-range",
            "/v2/models/layernorm/infer",
            _v2_json([1e39, 1.0]),
            JSON,
            400,
            "inputs.input: element [0] = 1e+39 is outside float32's finite range (|x| <= 3.402823e+38)",
        ),
        (
            "v2-header-length",
            "/v2/models/layernorm/infer",
            bad_header,
            {HEADER_LENGTH: "99999"},
            400,
            "Inference-Header-Content-Length: 99999 exceeds the body's 65 bytes (after decompression)",
        ),
    ]
    return [Case(n, p, b, h, False, _expect_error(s, f)) for n, p, b, h, s, f in rows]


def _v2_json(data: list[float]) -> bytes:
    return json.dumps({"inputs": [{"name": "input", "shape": [len(data)], "datatype": "FP32", "data": data}]}).encode()


def mixed_cases(runtime: Runtime, seed: int = 0) -> list[Case]:
    """About two valid requests for each invalid one, over every inference endpoint."""
    rng = np.random.default_rng(seed)
    valid = [
        normalize_case(rng, (4, 16), 1, "var"),
        normalize_case(rng, (2, 3, 8), 2, "std"),
        normalize_case(rng, (32, 128), 1, "var"),
        v2_layernorm_case(rng, 8, 64, binary=False),
        v2_layernorm_case(rng, 64, 128, binary=True),
        encode_case(runtime, rng, "encoder", 1, 8),
        encode_case(runtime, rng, "encoder-preln", 2, 4),
    ]
    invalid = invalid_cases()
    mixed: list[Case] = []
    for i, case in enumerate(valid * 2):
        mixed.append(case)
        if i % 2:
            mixed.append(invalid[(i // 2) % len(invalid)])
    return mixed


async def send(client: httpx.AsyncClient, case: Case) -> Outcome:
    """Send one case and judge its answer; a transport error is an outcome too, never an exception."""
    sent = time.monotonic()
    try:
        r = await client.post(case.path, content=case.body, headers=case.headers)
    except httpx.HTTPError as e:
        return Outcome(case.name, case.valid, sent, time.monotonic(), None, f"{type(e).__name__}: {e}")
    return Outcome(case.name, case.valid, sent, time.monotonic(), r.status_code, case.check(r))


async def run_load(
    base: str, cases: list[Case], concurrency: int, seconds: float, max_requests: int, tally: Tally[Outcome]
) -> None:
    """`concurrency` clients round-robin over cases until `seconds` pass or `max_requests` are sent."""
    deadline = time.monotonic() + seconds
    counter = iter(range(max_requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def worker(client: httpx.AsyncClient) -> None:
        for i in counter:
            if time.monotonic() >= deadline:
                return
            tally.outcomes.append(await send(client, cases[i % len(cases)]))

    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
