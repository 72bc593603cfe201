"""ModelInferRequest -> the data plane's input, and its result -> a ModelInferResponse with raw outputs.

This module only reads protobuf fields into one V2Request (app/server/api/v2/request.py);
app/server/api/v2/rules.py's `decode`, shared with the HTTP codec, checks every rule of it, the two
that exist in gRPC alone too (the raw_input_contents count, and which typed `contents` field holds a
datatype). Inputs come as raw_input_contents (what tritonclient sends) or typed contents; outputs always
go raw, appended to the protobuf header by app/server/api/v2/grpc/wire.py straight from the output arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tritonclient.grpc import service_pb2 as pb

from app.core.model import Model
from app.core.tensors import binary_view
from app.server.api.v2 import rules
from app.server.api.v2.grpc.wire import Encoded
from app.server.api.v2.request import Contents, V2Input, V2Output, V2Request
from app.server.api.v2.rules import InferRequest
from app.settings import Settings

# Triton marks every stream response with it (true: no more responses to this request); client loops wait for it.
FINAL_RESPONSE = "triton_final_response"


class InferCodec:
    """A ModelInferRequest for DataPlane.infer (app/server/pipeline.py's Codec): the model it names, its size as
    it came in, and whether its answer is a stream's (marked final, as Triton marks it)."""

    def __init__(self, request: Any, settings: Settings, bytes_in: int, final: bool) -> None:
        self.named = (request.model_name, request.model_version or None)  # an empty version is the latest
        self.settings = settings
        self.bytes_in = bytes_in
        self.final = final

    def size(self, request: Any) -> int:
        return self.bytes_in

    def target(self, request: Any) -> tuple[str, str | None]:
        return self.named

    def decode(self, request: Any, model: Model) -> tuple[Any, InferRequest]:
        req = decode(request, model, self.settings)
        return req.input, req

    def encode(self, model: Model, wire: InferRequest, result: Any) -> Encoded:
        return encode(model, wire, result, final=self.final)


def parameter_values(params: Mapping[str, Any]) -> dict[str, Any]:
    """map<string, InferParameter> -> {name: the value of its oneof} (None when none is set)."""
    return {name: _value(p) for name, p in params.items()}


def _value(param: Any) -> Any:
    choice = param.WhichOneof("parameter_choice")
    return None if choice is None else getattr(param, choice)


def decode(request: Any, model: Model, settings: Settings) -> InferRequest:
    """Read an infer request; rules.decode checks it, and the model's kind builds the data plane's input."""
    return rules.decode(v2_request(request), model, settings)


def v2_request(request: Any) -> V2Request:
    """A ModelInferRequest's fields as plain values, checked by nothing but protobuf's parsing."""
    return V2Request(
        id=request.id or None,
        parameters=parameter_values(request.parameters),
        inputs=[_input(entry) for entry in request.inputs],
        outputs=[V2Output(o.name, parameter_values(o.parameters)) for o in request.outputs],
        raw=request.raw_input_contents,
    )


def _input(entry: Any) -> V2Input:
    # Only the fields set: the rules name the first that cannot hold the datatype.
    data = Contents({f.name: v for f, v in entry.contents.ListFields()}) if entry.HasField("contents") else None
    return V2Input(entry.name, entry.datatype, list(entry.shape), parameter_values(entry.parameters), data)


def encode(model: Model, req: InferRequest, result: Any, final: bool = False) -> Encoded:
    """The response's fields by protobuf, each output's bytes as a view of its array (wire.py appends them);
    final: a stream's response, marked as Triton marks it."""
    response = pb.ModelInferResponse(model_name=model.name, model_version=model.version, id=req.id or "")
    if final:
        response.parameters[FINAL_RESPONSE].bool_param = True
    if req.ignored:  # as HTTP answers them: the request parameters that changed nothing
        response.parameters["ignored_parameters"].string_param = ",".join(req.ignored)
    raws = []
    for name, arr, _ in rules.output_tensors(model, req, result):
        response.outputs.add(name=name, datatype=req.datatype_of(name), shape=arr.shape)
        raws.append(binary_view(arr))
    return Encoded(response.SerializeToString(), tuple(raws))
