"""V2 infer requests and responses on the wire: a JSON header, then binary tensors, optionally compressed.

Layout (Triton's binary tensor extension): when the header `Inference-Header-Content-Length`
is present, the body's first N bytes are the JSON header and each binary input's bytes follow
in input order, `parameters.binary_data_size` each; otherwise the whole body is JSON. Every
check names its field, so onnxruntime never sees a tensor the metadata does not allow; the
protocol's rules themselves are app/server/api/v2/rules.py, shared with the gRPC codec.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.core import jsontensors
from app.core.halfprecision import HALF_DTYPES, widen
from app.core.jsonkeys import check_unique_keys
from app.core.model import Model, TensorSpec
from app.core.tensors import binary_view, decode_json_tensor, dumps, loads
from app.errors import InvalidInput, MalformedBody, shown
from app.server.api.v2 import rules
from app.server.api.v2.rules import FIELDS, InferRequest
from app.server.http.compression import choose_encoding, compress
from app.settings import Settings

HEADER_LENGTH = "Inference-Header-Content-Length"
# model_name and model_version: KServe's InferenceRESTClient sends them in the body, beside the URL's.
REQUEST_FIELDS = ("id", "model_name", "model_version", "parameters", "inputs", "outputs")
__all__ = ["FIELDS", "HEADER_LENGTH", "EncodedResponse", "InferCodec", "InferRequest", "decode", "encode"]


@dataclass(frozen=True)
class EncodedResponse:
    parts: tuple[bytes | memoryview, ...]  # the body in order: the JSON header, then each binary output's bytes
    headers: dict[str, str]
    media_type: str

    @property
    def body(self) -> bytes:
        return b"".join(self.parts)

    @property
    def length(self) -> int:
        return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in self.parts)


class InferCodec:
    """An infer request for DataPlane.infer (app/server/pipeline.py's Codec): the model its URL names, and the
    headers that shape its body (the binary header's length) and its answer (Accept-Encoding)."""

    def __init__(
        self, name: str, version: str | None, settings: Settings, header_length: str | None, accept: str | None
    ) -> None:
        self.named = (name, version)
        self.settings = settings
        self.header_length = header_length
        self.accept = accept

    def size(self, body: bytearray) -> int:
        return len(body)

    def target(self, body: bytearray) -> tuple[str, str | None]:
        return self.named

    def decode(self, body: bytearray, model: Model) -> tuple[Any, InferRequest]:
        req = decode(body, self.header_length, model, self.settings)
        return req.input, req

    def encode(self, model: Model, wire: InferRequest, result: Any) -> EncodedResponse:
        return encode(model, wire, result, self.accept)


def decode(body: bytearray, header_length: str | None, model: Model, settings: Settings) -> InferRequest:
    """Split and parse an infer request; the model's kind builds (and checks) the data plane's input."""
    head, binary = _split(body, header_length)
    # inputs[i].data straight into NumPy when the fast path is sure of it; orjson (and its messages) otherwise.
    doc = jsontensors.loads(head, lambda path: len(path) == 3 and path[0] == "inputs" and path[2] == "data")
    if doc is None:
        doc = loads(head, "body")
    if not isinstance(doc, dict):
        raise InvalidInput("expected a JSON object with `inputs`", "body")
    for key in doc:
        if key not in REQUEST_FIELDS:
            raise InvalidInput(f"unknown field; expected only {', '.join(REQUEST_FIELDS)}", key)
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput(f"expected a string, got {shown(request_id)}", "id")
    _same_model(doc, model)
    params = rules.parameters(doc.get("parameters"), model)
    # bytearray.find scans in place; `in` on a memoryview would compare single bytes.
    # Arrays the fast path parsed hold numbers only; the header is scanned for true/false only for lists.
    entries = doc.get("inputs")
    lists = isinstance(entries, list) and any(isinstance(e, dict) and isinstance(e.get("data"), list) for e in entries)
    may_hold_bools = lists and (body.find(b"true", 0, len(head)) >= 0 or body.find(b"false", 0, len(head)) >= 0)
    tensors, datatype = _inputs(doc.get("inputs"), binary, model, settings, may_hold_bools)
    outputs, asked = _requested_outputs(doc.get("outputs"), model, params.get("binary_data_output", False), datatype)
    check_unique_keys(body, len(head))  # last, when the header is known to hold only numbers besides the fields
    req = InferRequest(request_id, None, datatype, outputs, rules.ignored(params, model), asked)
    return dataclasses.replace(req, input=model.from_tensors(tensors, params, FIELDS, req.dtype))


def _same_model(doc: dict[str, Any], model: Model) -> None:
    """A body's model_name / model_version must name the model the URL chose (an empty version: any)."""
    name, version = doc.get("model_name"), doc.get("model_version")
    if name is not None and name != model.name:
        raise InvalidInput(f"{shown(name)} is not the model of the URL, {model.name!r}", "model_name")
    if version not in (None, "") and str(version) != model.version:
        raise InvalidInput(
            f"{shown(version)} is not the version that serves this request, {model.version}", "model_version"
        )


def _split(body: bytearray, header_length: str | None) -> tuple[memoryview, memoryview]:
    view = memoryview(body)
    if header_length is None:
        return view, view[len(view) :]
    text = header_length.strip(" \t")  # HTTP's own whitespace: str.strip() would drop a no-break space too
    if not (text.isascii() and text.isdigit()):
        raise MalformedBody(f"expected the JSON header's byte count, got {header_length!r}", HEADER_LENGTH)
    n = int(text)
    if n > len(body):
        raise MalformedBody(f"{n} exceeds the body's {len(body)} bytes (after decompression)", HEADER_LENGTH)
    return view[:n], view[n:]


def _inputs(
    raw: Any, binary: memoryview, model: Model, settings: Settings, may_hold_bools: bool
) -> tuple[dict[str, np.ndarray], str]:
    if not isinstance(raw, list) or not raw:
        raise InvalidInput("expected a non-empty list of input tensors", "inputs")
    tensors: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    offset = 0
    for i, entry in enumerate(raw):
        name = entry.get("name") if isinstance(entry, dict) else None
        spec = rules.input_spec(name, i, model, tensors)
        tensors[spec.name], datatypes[spec.name], size = _tensor(entry, spec, binary[offset:], settings, may_hold_bools)
        offset += size
    if offset != len(binary):
        raise MalformedBody(
            f"the inputs' binary_data_size add up to {offset} bytes, but {len(binary)} follow the JSON header",
            "binary_data_size",
        )
    model.check_tensors(tensors, FIELDS)
    # Outputs are sent in the datatype of `input` unless asked otherwise; a text encoder's inputs are tokens or
    # text, and its outputs float32.
    return tensors, datatypes.get("input", "FP32")


def _tensor(
    entry: dict[str, Any], spec: TensorSpec, rest: memoryview, settings: Settings, may_hold_bools: bool
) -> tuple[np.ndarray, str, int]:
    """One input: (array, its datatype, bytes it took from the binary section)."""
    field = f"inputs.{spec.name}"
    datatype, shape = rules.tensor_header(spec, entry.get("datatype"), entry.get("shape"), settings)
    params = rules.tensor_parameters(entry.get("parameters"), spec, ("binary_data_size",))
    if "binary_data_size" not in params:
        if "data" not in entry:
            raise InvalidInput("expected `data`, or parameters.binary_data_size with binary data", field)
        if datatype == "BYTES":
            return _strings(entry["data"], shape, f"{field}.data"), datatype, 0
        return _from_json(entry["data"], datatype, shape, field, settings, may_hold_bools), datatype, 0
    if "data" in entry:
        raise InvalidInput("has both `data` and parameters.binary_data_size; send one", field)
    size = params["binary_data_size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidInput(f"expected a byte count, got {shown(size)}", f"{field}.parameters.binary_data_size")
    if size > len(rest):
        raise MalformedBody(
            f"{size} bytes declared, but only {len(rest)} follow (is {HEADER_LENGTH} set?)",
            f"{field}.parameters.binary_data_size",
        )
    # A view of the body, no copy (peak RSS): the data plane's input checks and casts it, and
    # layernorm's conditioning reads it into a new aligned array (app/core/dataplane.py).
    return rules.from_raw(rest[:size], spec, datatype, shape, f"{field}.parameters.binary_data_size"), datatype, size


def _from_json(
    data: Any, datatype: str, shape: list[int], field: str, settings: Settings, may_hold_bools: bool
) -> np.ndarray:
    # Flat (row-major, as tritonclient sends) or nested: only the element count must match the shape.
    arr = decode_json_tensor(
        data,
        f"{field}.data",
        max_elements=settings.max_elements,
        max_depth=settings.max_depth,
        may_hold_bools=may_hold_bools,
        boolean=datatype == "BOOL",
    )
    rules.check_count(arr.size, shape, f"{field}.data")
    return rules.from_numbers(arr.reshape(shape), datatype, field)


def _strings(data: Any, shape: list[int], field: str) -> np.ndarray:
    """A BYTES tensor in JSON: a flat list of strings (as tritonclient sends it), each element a text."""
    if not isinstance(data, list):
        raise InvalidInput(f"{shown(data)}; expected a list of strings", field)
    for i, item in enumerate(data):
        if not isinstance(item, str):
            raise InvalidInput(f"{shown(item)}; expected a string", f"{field}[{i}]")
    rules.check_count(len(data), shape, field)
    return np.array(data, dtype=object).reshape(shape)


def _requested_outputs(
    raw: Any, model: Model, binary_default: bool, datatype: str
) -> tuple[list[tuple[str, bool]], dict[str, str]]:
    """The outputs to send (name, binary) and the datatypes of those not sent in the input's (`datatype`)."""
    if raw is not None and not isinstance(raw, list):
        raise InvalidInput("expected a list of {name, parameters}", "outputs")
    entries = [(e.get("name"), e.get("parameters")) if isinstance(e, dict) else (None, None) for e in raw or []]
    outputs = rules.requested_outputs(entries, model, binary_default, ("binary_data", "datatype"))
    return outputs, rules.output_datatypes(entries, model, datatype)


def encode(model: Model, req: InferRequest, result: Any, accept_encoding: str | None) -> EncodedResponse:
    """The JSON header with each output's data inline or as binary_data_size, then the bytes; a JSON-only
    answer compressed as Accept-Encoding asks."""
    outputs, blobs = [], []
    for name, arr, binary in rules.output_tensors(model, req, result):
        datatype = req.datatype_of(name)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if binary:
            blobs.append(binary_view(arr))  # a view: streamed from the array, or compressed, never copied whole
            entry["parameters"] = {"binary_data_size": blobs[-1].nbytes}
        else:
            # Flat, row-major, as Triton sends it. Half values as float64 prints them, which every reader gets
            # back exactly, whatever type it reads them into (tritonclient: BF16 into float32, FP16 into float16).
            entry["data"] = (widen(arr).astype(np.float64) if datatype in HALF_DTYPES else arr).reshape(-1)
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": model.name, "model_version": model.version}
    if req.id is not None:
        doc["id"] = req.id
    if req.ignored:
        doc["parameters"] = {"ignored_parameters": ",".join(req.ignored)}
    doc["outputs"] = outputs
    header = dumps(doc)
    headers: dict[str, str] = {}
    media_type = "application/json"
    if blobs:
        # The uncompressed length: tritonclient decompresses the whole body before splitting it.
        headers[HEADER_LENGTH] = str(len(header))
        media_type = "application/octet-stream"
    parts: tuple[bytes | memoryview, ...] = (header, *blobs)
    # Binary tensors go out uncompressed whatever Accept-Encoding says: float data shrank 7% for 10x the time
    # (a 61 MiB answer: 2.4 s gzipped instead of 0.25 s, and 504s at concurrency 16; docs/reliability.md).
    encoding = None if blobs else choose_encoding(accept_encoding)
    if encoding is None:
        # Not joined: the route streams large binary outputs straight from their arrays (peak RSS, measured).
        return EncodedResponse(parts, headers, media_type)
    headers["Content-Encoding"] = encoding
    return EncodedResponse((compress(parts, encoding),), headers, media_type)
