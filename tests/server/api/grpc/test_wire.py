"""wire.py: raw outputs appended to protobuf's own serialization give exactly the message protobuf would write."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from app.core.tensors import binary_view
from app.server.api.grpc.wire import Encoded, serialize_infer, serialize_stream, size, varint


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
    data = serialize_infer(encoded)
    assert data == full.SerializeToString()
    parsed = pb.ModelInferResponse.FromString(data)
    assert [np.frombuffer(raw, np.float32).size for raw in parsed.raw_output_contents] == sizes
    assert size(encoded) == len(data)


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
