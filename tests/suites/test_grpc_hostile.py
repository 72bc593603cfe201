"""Hostile gRPC input: a bounded fuzz of ModelInfer requests never gets INTERNAL or UNKNOWN, and never kills a worker.

Random shapes, datatypes, byte counts that disagree with the shapes, NaN and Inf in raw bytes, typed contents in
the wrong field, random parameters, 10,000 inputs, empty names, bytes that are no protobuf at all. Every answer
must be OK or a client error; afterwards the same process answers a valid request correctly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from app.core import reference
from app.core.tensors import DATATYPES
from tests.server.api.grpc.live import GrpcServer, grpc_server

CASES = 400
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # a message over the 4 MiB limit, refused by grpc itself
}
MODELS = ["layernorm", "encoder", "encoder-preln", "", "gpt", "layernorm\x00"]
NAMES = ["input", "gamma", "beta", "padding_mask", "", "x", "input " * 3]
DATATYPE_NAMES = [*DATATYPES, "", "FP8", "BYTES", "fp32"]
TYPED = ["fp32_contents", "fp64_contents", "bool_contents", "int_contents", "int64_contents", "bytes_contents"]
DIMS = [-1, 0, 1, 1, 2, 3, 8, 128, 2**40]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    env = {"NORMSERVE_MAX_BODY_BYTES": str(4 << 20), "NORMSERVE_LOG_LEVEL": "warning"}
    with grpc_server(tmp_path_factory.mktemp("hostile"), env) as server:
        yield server


@pytest.fixture(scope="module")
def channel(live: GrpcServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(live.address, options=[("grpc.max_send_message_length", -1)]) as c:
        yield c


def _raw(rng: np.random.Generator, datatype: str, shape: list[int]) -> bytes:
    """Bytes that fit the shape, or not; floats sometimes NaN or Inf."""
    itemsize = DATATYPES[datatype].itemsize if datatype in DATATYPES else 4
    count = math.prod(shape) if shape and all(0 < d < 4096 for d in shape) else int(rng.integers(0, 64))
    nbytes = max(0, min(count * itemsize + int(rng.choice([0, 0, 0, -1, 1, -itemsize, itemsize])), 1 << 20))
    data = bytearray(rng.bytes(nbytes))
    if datatype in ("FP32", "FP64", "FP16", "BF16") and nbytes >= itemsize and rng.random() < 0.5:
        special = np.array([rng.choice([np.nan, np.inf, -np.inf])], DATATYPES[datatype]).tobytes()
        at = int(rng.integers(0, nbytes // itemsize)) * itemsize
        data[at : at + itemsize] = special
    if datatype == "BOOL" and rng.random() < 0.7:
        data = bytearray(b % 2 for b in data)
    return bytes(data)


def _parameter(rng: np.random.Generator, param: Any) -> None:
    choice = int(rng.integers(0, 5))
    if choice == 0:
        param.bool_param = bool(rng.integers(0, 2))
    elif choice == 1:
        param.int64_param = int(rng.integers(-5, 5))
    elif choice == 2:
        param.string_param = str(rng.choice(["var", "std", "", "nan", "1e-5"]))
    elif choice == 3:
        param.double_param = float(rng.choice([1e-5, 0.0, -1.0, np.nan, np.inf, 1e300]))
    # 4: nothing set


def near_valid_request(rng: np.random.Generator) -> Any:
    """A layernorm request right but for what chance breaks: NaN/Inf or a byte off in raw bytes, a parameter."""
    shape = [int(d) for d in rng.integers(1, 9, int(rng.integers(1, 4)))]
    datatype = str(rng.choice(["FP32", "FP64"]))
    r = pb.ModelInferRequest(model_name="layernorm")
    r.inputs.add(name="input", datatype=datatype, shape=shape)
    x = rng.standard_normal(shape).astype(DATATYPES[datatype])
    if rng.random() < 0.3:
        x.flat[int(rng.integers(0, x.size))] = rng.choice([np.nan, np.inf, -np.inf])
    raw = x.tobytes()
    r.raw_input_contents.append(raw[: -1 if rng.random() < 0.15 else len(raw)])
    if rng.random() < 0.3:
        _parameter(rng, r.parameters[str(rng.choice(["eps", "eps_mode", "normalized_ndim"]))])
    return r


def random_request(rng: np.random.Generator) -> Any:
    if rng.random() < 0.3:
        return near_valid_request(rng)
    r = pb.ModelInferRequest(model_name=str(rng.choice(MODELS)), id=str(rng.integers(0, 1000)))
    raw_mode = rng.random() < 0.7
    for _ in range(int(rng.integers(0, 4))):
        datatype = str(rng.choice(DATATYPE_NAMES))
        shape = [int(rng.choice(DIMS)) for _ in range(int(rng.integers(0, 6)))]
        entry = r.inputs.add(name=str(rng.choice(NAMES)), datatype=datatype, shape=shape)
        if raw_mode:
            r.raw_input_contents.append(_raw(rng, datatype, shape))
        elif rng.random() < 0.8:
            field = str(rng.choice(TYPED))
            values: list[Any] = rng.standard_normal(int(rng.integers(0, 40))).tolist()
            if field == "bool_contents":
                values = [v > 0 for v in values]
            elif field in ("int_contents", "int64_contents"):
                values = [int(v * 10) for v in values]
            elif field == "bytes_contents":
                values = [rng.bytes(3) for _ in values]
            getattr(entry.contents, field).extend(values)
    if raw_mode and rng.random() < 0.1:
        r.raw_input_contents.append(b"extra")
    for name in rng.choice(["eps", "eps_mode", "normalized_ndim", "priority", "zzz"], int(rng.integers(0, 3))):
        _parameter(rng, r.parameters[str(name)])
    return r


def send(channel: grpc.Channel, data: bytes) -> tuple[grpc.StatusCode, str]:
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
    try:
        call(data, timeout=30)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def assert_answers_right(channel: grpc.Channel) -> None:
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    r = pb.ModelInferRequest(model_name="layernorm")
    r.inputs.add(name="input", datatype="FP32", shape=[4, 16])
    r.raw_input_contents.append(x.tobytes())
    response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(r, timeout=30)
    out = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(4, 16)
    np.testing.assert_allclose(out, reference.layer_norm(x, 1).output, atol=2e-5)


def test_random_infer_requests_get_ok_or_a_client_error(live: GrpcServer, channel: grpc.Channel) -> None:
    rng = np.random.default_rng(20261123)
    codes: dict[grpc.StatusCode, int] = {}
    for i in range(CASES):
        code, details = send(channel, random_request(rng).SerializeToString())
        codes[code] = codes.get(code, 0) + 1
        assert code in ALLOWED, f"case {i}: {code} {details!r}"
    print(f"\ngRPC fuzz: {CASES} requests, {dict((c.name, n) for c, n in codes.items())}")
    assert codes.get(grpc.StatusCode.INVALID_ARGUMENT, 0) > CASES // 3 and codes.get(grpc.StatusCode.OK, 0) > 10
    assert live.proc.poll() is None
    assert_answers_right(channel)


def _many_inputs(names: list[str]) -> bytes:
    r = pb.ModelInferRequest(model_name="layernorm")
    for name in names:
        r.inputs.add(name=name, datatype="FP32", shape=[1])
        r.raw_input_contents.append(b"\0\0\0\0")
    return bytes(r.SerializeToString())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            _many_inputs([f"input{i}" for i in range(10_000)]),
            "inputs.input0: unknown input for model 'layernorm'; expected input, gamma, beta",
        ),
        (_many_inputs(["input"] * 10_000), "inputs.input: given twice"),
        (_many_inputs([""]), "inputs.: unknown input for model 'layernorm'; expected input, gamma, beta"),
        (
            b"\xff\xff\xff\xff",
            "request: not a valid inference.ModelInferRequest (Error parsing message with type 'inference.ModelInferRequest')",
        ),
        (
            b"\x2a\x10\x0a\x03abc",  # inputs[0] declares 16 bytes, 5 follow
            "request: not a valid inference.ModelInferRequest (Error parsing message with type 'inference.ModelInferRequest')",
        ),
        (b"", "model: expected a model name matching [A-Za-z0-9][A-Za-z0-9_.-]{0,63}, got ''"),
    ],
    ids=["10000-inputs", "10000-repeats", "empty-name", "not-protobuf", "truncated", "empty-message"],
)
def test_crafted_messages_are_client_errors_and_the_worker_lives(
    live: GrpcServer, channel: grpc.Channel, data: bytes, message: str
) -> None:
    code = grpc.StatusCode.NOT_FOUND if "unknown model" in message else grpc.StatusCode.INVALID_ARGUMENT
    assert send(channel, data) == (code, message)
    assert live.proc.poll() is None
    assert_answers_right(channel)


def test_a_stream_of_hostile_requests_answers_each_in_its_error_message(
    live: GrpcServer, channel: grpc.Channel
) -> None:
    rng = np.random.default_rng(7)
    requests = [random_request(rng).SerializeToString() for _ in range(60)] + [b"\xff\xff"]
    stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
    answers = [pb.ModelStreamInferResponse.FromString(a) for a in stream(iter(requests), timeout=60)]
    assert len(answers) == len(requests)
    assert all(a.error_message != "" or a.infer_response.model_name for a in answers)
    assert "internal error" not in {a.error_message for a in answers}
    assert answers[-1].error_message.startswith("request: not a valid inference.ModelInferRequest")
    assert live.proc.poll() is None
    assert_answers_right(channel)
