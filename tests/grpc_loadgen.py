"""A bounded gRPC load generator for the load, drain and failover suites: mixed ModelInfer calls, each answer checked.

Valid calls are checked against the float64 NumPy reference (app.core.reference), invalid ones against their whole
status and message. grpc.aio clients on a few channels (HTTP/2 multiplexes the rest), bounded in time and count.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from app.core import reference
from app.core.runtime import Runtime
from tests.loadgen import Tally

Check = Callable[[grpc.StatusCode, str, Any], "str | None"]
INFER = "/inference.GRPCInferenceService/ModelInfer"
APP_RETRIES = 3  # resends of a call that came back UNAVAILABLE, with retry=True
# grpc's own retry policy, as README recommends to clients behind a load balancer: nginx streams a gRPC request to
# its replica unbuffered, so it cannot resend one that was in flight on a replica that died; the client does.
RETRY = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "inference.GRPCInferenceService"}],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


@dataclass(frozen=True)
class GrpcCase:
    """One ModelInfer request (serialized once) and how its answer must look: `check` gives None or why not."""

    name: str
    request: bytes
    valid: bool
    check: Check


@dataclass
class GrpcOutcome:
    case: str
    valid: bool
    sent: float
    done: float
    code: grpc.StatusCode
    problem: str | None

    def counted(self) -> dict[str, bool]:
        """What the Tally's summary counts of a gRPC answer beyond its case's verdict."""
        return {"internal_or_unknown": self.code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)}


def request(model: str, tensors: list[tuple[str, np.ndarray]], **params: Any) -> Any:
    r = pb.ModelInferRequest(model_name=model)
    datatypes = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64", np.dtype(bool): "BOOL"}
    for name, arr in tensors:
        r.inputs.add(name=name, datatype=datatypes[arr.dtype], shape=arr.shape)
        r.raw_input_contents.append(arr.tobytes())
    for name, value in params.items():
        param = r.parameters[name]
        if isinstance(value, str):
            param.string_param = value
        elif isinstance(value, int):
            param.int64_param = value
        else:
            param.double_param = value
    return r


def expect_output(want: np.ndarray, atol: float, dtype: Any = np.float32) -> Check:
    def check(code: grpc.StatusCode, details: str, response: Any) -> str | None:
        if code != grpc.StatusCode.OK:
            return f"{code.name}: {details[:200]}"
        got = np.frombuffer(response.raw_output_contents[0], dtype).reshape(want.shape)
        diff = float(np.abs(got - want).max())
        return None if diff <= atol else f"max abs diff {diff:.3g} > {atol:.3g}"

    return check


def expect_error(code: grpc.StatusCode, message: str) -> Check:
    def check(got: grpc.StatusCode, details: str, response: Any) -> str | None:
        return (
            None if (got, details) == (code, message) else f"{got.name} {details!r}, expected {code.name} {message!r}"
        )

    return check


def valid_cases(runtime: Runtime, rng: np.random.Generator) -> list[GrpcCase]:
    cases = []
    for shape, k, mode, dtype in [
        ((4, 16), 1, "var", np.float32),
        ((2, 3, 8), 2, "std", np.float32),
        ((8, 32), 1, "var", np.float64),
    ]:
        x = (rng.standard_normal(shape) * rng.uniform(0.1, 50) + rng.uniform(-500, 500)).astype(dtype)
        gamma = rng.uniform(0.5, 2, shape[-k:]).astype(dtype)
        want = reference.layer_norm(x.astype(np.float32), k, 1e-5, mode, gamma).output
        r = request("layernorm", [("input", x), ("gamma", gamma)], eps_mode=mode, normalized_ndim=k)
        cases.append(
            GrpcCase(f"layernorm{list(shape)}-{mode}", r.SerializeToString(), True, expect_output(want, 4e-5, dtype))
        )
    for model, batch, seq in [("encoder", 1, 8), ("encoder-preln", 2, 4)]:
        m: Any = runtime.get(model)
        x = rng.standard_normal((batch, seq, m.config.d_model)).astype(np.float32)
        mask = np.zeros((batch, seq), bool)
        mask[:, -1] = True
        want, _ = reference.encoder(x, m.weights, m.config, mask)
        r = request(model, [("input", x), ("padding_mask", mask)])
        cases.append(GrpcCase(f"{model}[{batch},{seq}]", r.SerializeToString(), True, expect_output(want, 1e-4)))
    return cases


def invalid_cases() -> list[GrpcCase]:
    x = np.ones((2, 3), np.float32)
    bad_bytes = request("layernorm", [("input", x)])
    bad_bytes.raw_input_contents[0] = b"\0" * 20
    nan = np.array([[1.0, np.nan]], np.float32)
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    rows = [
        ("unknown-model", request("gpt", [("input", x)]), grpc.StatusCode.NOT_FOUND, "model: unknown model 'gpt'; available: encoder, encoder-preln, layernorm"),
        ("eps", request("layernorm", [("input", x)], eps=-1.0), invalid, "parameters.eps: expected a finite number > 0, got -1.0"),
        ("nan", request("layernorm", [("input", nan)]), invalid, "inputs.input: element [0, 1] = nan is outside float32's finite range (|x| <= 3.402823e+38)"),
        ("raw-bytes", bad_bytes, invalid, "inputs.input: raw_input_contents is 20 bytes, but shape [2, 3] of FP32 needs 24"),
        ("d-model", request("encoder", [("input", np.zeros((1, 2, 3), np.float32))]), invalid, "inputs.input: last dimension is 3, expected d_model = 128 (model 'encoder', version 1)"),
    ]  # fmt: skip
    return [GrpcCase(n, r.SerializeToString(), False, expect_error(c, m)) for n, r, c, m in rows]


def mixed_cases(runtime: Runtime, seed: int = 0) -> list[GrpcCase]:
    """About two valid calls for each invalid one, over every model."""
    valid, invalid = valid_cases(runtime, np.random.default_rng(seed)), invalid_cases()
    mixed: list[GrpcCase] = []
    for i, case in enumerate(valid * 2):
        mixed.append(case)
        if i % 2:
            mixed.append(invalid[(i // 2) % len(invalid)])
    return mixed


async def send(channel: grpc.aio.Channel, case: GrpcCase, timeout: float = 30) -> GrpcOutcome:
    """One call and its judgement; a transport failure is an outcome too (UNAVAILABLE, ...), never an exception."""
    call = channel.unary_unary(INFER, response_deserializer=pb.ModelInferResponse.FromString)
    sent = time.monotonic()
    try:
        response = await call(case.request, timeout=timeout)
        code, details = grpc.StatusCode.OK, ""
    except grpc.aio.AioRpcError as e:
        response, code, details = None, e.code(), e.details() or ""
    return GrpcOutcome(case.name, case.valid, sent, time.monotonic(), code, case.check(code, details, response))


async def run_load(
    address: str,
    cases: list[GrpcCase],
    concurrency: int,
    seconds: float,
    max_requests: int,
    tally: Tally[GrpcOutcome],
    channels: int = 4,
    retry: bool = False,
) -> None:
    """`concurrency` clients round-robin over cases on `channels` channels until `seconds` pass or `max_requests`;
    retry: with the RETRY policy on every channel."""
    deadline = time.monotonic() + seconds
    counter = iter(range(max_requests))
    options: list[tuple[str, Any]] = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    if retry:
        options.append(("grpc.service_config", RETRY))
    opened = [grpc.aio.insecure_channel(address, options=options) for _ in range(channels)]

    async def client(channel: grpc.aio.Channel) -> None:
        for i in counter:
            if time.monotonic() >= deadline:
                return
            case = cases[i % len(cases)]
            outcome = await send(channel, case)
            # grpc's own retries stop once the call is committed: a 502 that nginx answers with headers for a
            # replica that died mid-call commits it. So the client resends it itself, as an application would.
            for attempt in range(APP_RETRIES if retry else 0):
                if outcome.code != grpc.StatusCode.UNAVAILABLE:
                    break
                await asyncio.sleep(0.05 * 2**attempt)
                outcome = await send(channel, case)
            tally.outcomes.append(outcome)

    try:
        await asyncio.gather(*(client(opened[i % channels]) for i in range(concurrency)))
    finally:
        for channel in opened:
            await channel.close()


def stub(channel: grpc.Channel) -> Any:
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)
