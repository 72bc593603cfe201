"""V2 infer requests and responses on the wire: a JSON header, then binary tensors, optionally compressed.

Layout (Triton's binary tensor extension): when the header `Inference-Header-Content-Length`
is present, the body's first N bytes are the JSON header and each binary input's bytes follow
in input order, `parameters.binary_data_size` each; otherwise the whole body is JSON. This module
reads the body into one V2Request (app/server/api/v2/request.py), refusing only what is not JSON;
app/server/api/v2/rules.py's `decode`, shared with the gRPC codec, checks every rule of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.core import jsontensors
from app.core.halfprecision import HALF_DTYPES, widen
from app.core.model import Model
from app.core.tensors import binary_view, dumps, loads
from app.errors import InvalidInput, MalformedBody, shown
from app.server.api.v2 import rules
from app.server.api.v2.elements import HEADER_LENGTH
from app.server.api.v2.request import Inline, JsonHeader, V2Input, V2Output, V2Request
from app.server.api.v2.rules import FIELDS, InferRequest
from app.server.http.compression import choose_encoding, compress
from app.settings import Settings

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
    """Split and parse an infer request; rules.decode checks it, and the model's kind builds the data plane's input."""
    return rules.decode(v2_request(body, header_length), model, settings)


def v2_request(body: bytearray, header_length: str | None) -> V2Request:
    """The request as sent, read from its JSON header and binary part; checked here only as JSON."""
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
    entries, outputs = doc.get("inputs"), doc.get("outputs")
    # bytearray.find scans in place; `in` on a memoryview would compare single bytes.
    # Arrays the fast path parsed hold numbers only; the header is scanned for true/false only for lists.
    lists = isinstance(entries, list) and any(isinstance(e, dict) and isinstance(e.get("data"), list) for e in entries)
    may_hold_bools = lists and (body.find(b"true", 0, len(head)) >= 0 or body.find(b"false", 0, len(head)) >= 0)
    return V2Request(
        id=request_id,
        parameters=doc.get("parameters"),
        inputs=[_input(e) for e in entries] if isinstance(entries, list) else [],
        outputs=None if outputs is not None and not isinstance(outputs, list) else [_output(e) for e in outputs or []],
        model_name=doc.get("model_name"),
        model_version=doc.get("model_version"),
        binary=binary,
        binary_outputs=True,
        json=JsonHeader(body, len(head), may_hold_bools),
    )


def _input(entry: Any) -> V2Input:
    if not isinstance(entry, dict):
        return V2Input(None, None, None)  # refused by its missing name
    data = Inline(entry["data"]) if "data" in entry else None
    return V2Input(entry.get("name"), entry.get("datatype"), entry.get("shape"), entry.get("parameters"), data)


def _output(entry: Any) -> V2Output:
    return V2Output(entry.get("name"), entry.get("parameters")) if isinstance(entry, dict) else V2Output(None)


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
