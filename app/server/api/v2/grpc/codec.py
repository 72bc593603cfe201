"""ModelInferRequest -> the data plane's input, and its result -> a ModelInferResponse with raw outputs.

Every rule of the protocol is app/server/api/v2/rules.py, shared with the HTTP codec: this module
only reads protobuf fields into plain values, plus the two rules that exist in gRPC alone (the
raw_input_contents count, and which typed `contents` field holds a datatype). Inputs come as
raw_input_contents (what tritonclient sends) or typed contents; outputs always go raw, appended
to the protobuf header by app/server/api/v2/grpc/wire.py straight from the output arrays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from app.core.halfprecision import HALF_DTYPES
from app.core.model import Model, TensorSpec
from app.core.tensors import DATATYPES, binary_view
from app.errors import InvalidInput
from app.server.api.v2 import rules, strings
from app.server.api.v2.grpc.wire import Encoded
from app.server.api.v2.rules import FIELDS, InferRequest
from app.settings import Settings

# The typed contents field of each datatype a model accepts (InferTensorContents).
# The protocol has no typed field for FP16 and BF16: fp32_contents are read, rounded as JSON numbers are.
CONTENTS = {
    "BOOL": "bool_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "FP16": "fp32_contents",
    "BF16": "fp32_contents",
    "INT64": "int64_contents",  # a text encoder's token ids
    "BYTES": "bytes_contents",  # a text encoder's texts, UTF-8
}
RAW = "raw_input_contents"
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
    """Read and check an infer request (rules.py); the model's kind builds the data plane's input."""
    params = rules.parameters(parameter_values(request.parameters), model)
    tensors, datatype = _inputs(request, model, settings)
    entries = [(o.name, parameter_values(o.parameters)) for o in request.outputs]
    outputs = rules.requested_outputs(entries, model, False, ("datatype",))
    asked = rules.output_datatypes(entries, model, datatype)
    req = InferRequest(request.id or None, None, datatype, outputs, rules.ignored(params, model), asked)
    return dataclasses.replace(req, input=model.from_tensors(tensors, params, FIELDS, req.dtype))


def _inputs(request: Any, model: Model, settings: Settings) -> tuple[dict[str, np.ndarray], str]:
    entries = request.inputs
    if not entries:
        raise InvalidInput("expected a non-empty list of input tensors", "inputs")
    raw = request.raw_input_contents
    if raw and len(raw) != len(entries):
        raise InvalidInput(f"{len(raw)} for {len(entries)} inputs; expected one per input, in order, or none", RAW)
    tensors: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    for i, entry in enumerate(entries):
        spec = rules.input_spec(entry.name, i, model, tensors)
        datatype, shape = rules.tensor_header(spec, entry.datatype, list(entry.shape), settings)
        # KServe's client names each raw input's size: accepted, as the raw bytes' own length is what counts.
        rules.tensor_parameters(parameter_values(entry.parameters), spec, ("binary_data_size",))
        # raw[i] copies the bytes out of the message once; the array is then a view of that copy.
        tensors[spec.name] = _tensor(entry, spec, datatype, shape, raw[i] if raw else None)
        datatypes[spec.name] = datatype
    model.check_tensors(tensors, FIELDS)
    return tensors, datatypes.get("input", "FP32")  # a text encoder's outputs are float32 (see the HTTP codec)


def _tensor(entry: Any, spec: TensorSpec, datatype: str, shape: list[int], raw: bytes | None) -> np.ndarray:
    field = f"inputs.{spec.name}"
    typed = CONTENTS[datatype]
    if raw is not None:
        if entry.HasField("contents"):
            raise InvalidInput(f"has both contents and {RAW}; send one", field)
        return rules.from_raw(raw, spec, datatype, shape, field, RAW)
    if not entry.HasField("contents"):
        raise InvalidInput(f"expected contents.{typed}, or {RAW}", field)
    others = [f.name for f, _ in entry.contents.ListFields() if f.name != typed]
    if others:
        raise InvalidInput(f"{others[0]} cannot hold {datatype}; expected {typed}", f"{field}.contents")
    values = getattr(entry.contents, typed)
    rules.check_count(len(values), shape, f"{field}.contents.{typed}")
    if datatype == "BYTES":
        texts = [strings.utf8(v, f"{field}[{i}]") for i, v in enumerate(values)]
        return np.array(texts, dtype=object).reshape(shape)
    arr = np.array(values, dtype=DATATYPES["FP32" if datatype in HALF_DTYPES else datatype]).reshape(shape)
    return rules.from_numbers(arr, datatype, field)


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
