"""request.py: the one plain value each V2 transport reads its wire into, as the HTTP and gRPC codecs build it:
fields as sent and unchecked, tensor data located but not decoded, no copy of a binary tensor."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb

from app.server.api.v2.grpc import codec as grpc_codec
from app.server.api.v2.http import codec as http_codec
from app.server.api.v2.request import Contents, Inline, V2Input, V2Output

X = np.array([[1.0, 2.0, 4.0], [0.5, 0.25, 8.0]], np.float32)


def test_one_request_reads_into_the_same_inputs_and_outputs_over_http_and_grpc() -> None:
    head = orjson.dumps(
        {
            "id": "r",
            "parameters": {"eps": 0.5},
            "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}],
            "outputs": [{"name": "mean", "parameters": {"datatype": "FP64"}}],
        }
    )
    over_http = http_codec.v2_request(bytearray(head + X.tobytes()), str(len(head)))
    message = pb.ModelInferRequest(model_name="layernorm", id="r", raw_input_contents=[X.tobytes()])
    message.parameters["eps"].double_param = 0.5
    message.inputs.add(name="input", datatype="FP32", shape=[2, 3]).parameters["binary_data_size"].int64_param = 24
    message.outputs.add(name="mean").parameters["datatype"].string_param = "FP64"
    over_grpc = grpc_codec.v2_request(message)
    expected_input = V2Input("input", "FP32", [2, 3], {"binary_data_size": 24})
    assert list(over_http.inputs) == list(over_grpc.inputs) == [expected_input]
    assert list(over_http.outputs or ()) == list(over_grpc.outputs or ()) == [V2Output("mean", {"datatype": "FP64"})]
    assert (over_http.id, over_http.parameters) == (over_grpc.id, over_grpc.parameters) == ("r", {"eps": 0.5})
    assert over_http.binary is not None and bytes(over_http.binary) == bytes(over_grpc.raw[0]) == X.tobytes()
    assert (over_http.binary_outputs, over_grpc.binary_outputs) == (True, False)


def test_a_binary_part_is_a_view_of_the_body() -> None:
    head = b'{"inputs": []}'
    body = bytearray(head + X.tobytes())
    binary = http_codec.v2_request(body, str(len(head))).binary
    assert binary is not None and binary.obj is body and binary.nbytes == X.nbytes


@pytest.mark.parametrize(
    ("doc", "inputs", "outputs"),
    [
        ({"inputs": {"name": "input"}}, [], []),  # not a list: refused by the rules as no inputs
        ({"inputs": [1, {"name": "x", "data": None}]}, [V2Input(None, None, None), V2Input("x", None, None, None, Inline(None))], []),
        ({"inputs": [], "outputs": {"name": "mean"}}, [], None),  # not a list: refused by the rules in turn
        ({"inputs": [], "outputs": [1, {"name": "mean"}]}, [], [V2Output(None), V2Output("mean")]),
    ],
)  # fmt: skip
def test_http_fields_are_kept_as_sent_for_the_rules_to_name(doc: dict[str, Any], inputs: Any, outputs: Any) -> None:
    request = http_codec.v2_request(bytearray(orjson.dumps(doc)), None)
    assert list(request.inputs) == inputs
    assert request.outputs == outputs


def test_grpc_typed_contents_are_every_field_set_by_name() -> None:
    message = pb.ModelInferRequest(model_name="layernorm")
    tensor = message.inputs.add(name="input", datatype="FP32", shape=[1])
    tensor.contents.fp32_contents.append(1.5)
    tensor.contents.int64_contents.append(2)
    (read,) = grpc_codec.v2_request(message).inputs
    assert isinstance(read.data, Contents)
    assert {name: list(values) for name, values in read.data.fields.items()} == {
        "int64_contents": [2],
        "fp32_contents": [1.5],
    }
