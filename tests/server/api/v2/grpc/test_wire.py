"""wire.py: raw outputs appended to protobuf's own serialization give exactly the message protobuf would write, and
requests read with their raw inputs as views give exactly the message protobuf reads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from app.core.tensors import binary_view
from app.server.api.v2.grpc.wire import (
    MAX_RECORDS,
    Encoded,
    parse_infer,
    serialize_infer,
    serialize_stream,
    size,
    varint,
)


def _response(arrays: list[np.ndarray]) -> tuple[Encoded, Any]:
    head = pb.ModelInferResponse(model_name="layernorm", model_version="1", id="7")
    for i, arr in enumerate(arrays):
        head.outputs.add(name=f"out{i}", datatype="FP32", shape=arr.shape)
    full = pb.ModelInferResponse()
    full.CopyFrom(head)
    full.raw_output_contents.extend(arr.tobytes() for arr in arrays)
    return Encoded(head.SerializeToString(), tuple(binary_view(a) for a in arrays)), full


@pytest.mark.parametrize(
    "n", [0, 1, 127, 128, 16383, 16384, 2**21 + 3], ids=lambda n: f"{n}B"
)  # the varint's byte-count boundaries
def test_varint_is_protobufs(n: int) -> None:
    from google.protobuf.internal.encoder import _VarintBytes

    assert varint(n) == _VarintBytes(n)


@pytest.mark.parametrize(
    "sizes",
    [[], [1], [31], [32], [4096], [1, 4096 * 1024, 3]],
    ids=lambda s: "+".join(str(n) for n in s) or "none",
)
def test_an_encoded_answer_is_the_message_protobuf_writes(sizes: list[int]) -> None:
    arrays = [np.arange(n, dtype=np.float32) for n in sizes]
    encoded, full = _response(arrays)
    length = size(encoded)  # the log line's, taken before grpc serializes
    data = serialize_infer(encoded)
    assert data == full.SerializeToString() and length == len(data)
    parsed = pb.ModelInferResponse.FromString(data)
    assert [np.frombuffer(raw, np.float32).size for raw in parsed.raw_output_contents] == sizes
    assert encoded.raws == ()  # joined: the output arrays are no longer held through the answer


def test_a_stream_answer_wraps_the_encoded_message_as_infer_response() -> None:
    encoded, full = _response([np.linspace(-1, 1, 300, dtype=np.float32)])
    parsed = pb.ModelStreamInferResponse.FromString(serialize_stream(encoded))
    assert parsed.error_message == "" and parsed.infer_response == full


def test_protobuf_messages_pass_through_unchanged() -> None:
    error = pb.ModelStreamInferResponse(error_message="inputs.input: given twice")
    assert serialize_stream(error) == error.SerializeToString()
    live = pb.ServerLiveResponse(live=True)
    assert serialize_infer(live) == live.SerializeToString() and size(live) == live.ByteSize()


def test_outputs_are_views_of_their_arrays_until_the_one_join() -> None:
    arr = np.ones((256, 256), np.float32)
    encoded, _ = _response([arr])
    assert encoded.raws[0].obj is arr or np.shares_memory(np.asarray(encoded.raws[0]), arr)


def _request(raws: list[bytes], parameters: int = 1) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="layernorm", model_version="1", id="r-1")
    for i, raw in enumerate(raws):
        r.inputs.add(name=f"in{i}", datatype="FP32", shape=[len(raw) // 4])
    r.outputs.add(name="output")
    for i in range(parameters):
        r.parameters[f"p{i}"].int64_param = i
    r.raw_input_contents.extend(raws)
    return r


@pytest.mark.parametrize(
    ("raws", "parameters"),
    [([], 1), ([b""], 1), ([b"\x00" * 4], 0), ([bytes(range(256)) * 64, b"\x01" * 8], 3), ([b"\x02" * 4], MAX_RECORDS)],
    ids=["no-raw", "empty-raw", "one-raw", "two-raws", "past-max-records"],
)
def test_a_request_reads_as_protobuf_reads_it(raws: list[bytes], parameters: int) -> None:
    sent = _request(raws, parameters)
    data = sent.SerializeToString()
    got = parse_infer(data)
    assert [bytes(raw) for raw in got.raw_input_contents] == list(sent.raw_input_contents)
    assert (got.model_name, got.model_version, got.id, got.ByteSize()) == ("layernorm", "1", "r-1", len(data))
    assert list(got.inputs) == list(sent.inputs) and dict(got.parameters) == dict(sent.parameters)


def test_raw_inputs_are_views_of_the_received_bytes() -> None:
    data = _request([b"\x03" * 4096]).SerializeToString()
    raw = parse_infer(data).raw_input_contents[0]
    assert isinstance(raw, memoryview) and raw.obj is data


@pytest.mark.parametrize(
    "data",
    [b"\x0a\x05abc", b"\x3a\x09\x00", b"\x0b\x01", b"\xff" * 12, b"\x3a\x01\x00\x0b"],
    ids=["short-string", "short-raw", "group", "overlong-varint", "raw-then-group"],
)
def test_a_broken_request_is_protobufs_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError) as raised:
        parse_infer(data)
    assert str(raised.value) == "Error parsing message with type 'inference.ModelInferRequest'"
