"""Infer responses on the wire: protobuf for the fields, the output tensors appended from their arrays.

A protobuf message's encoding is the concatenation of its fields' encodings, in any order, and a
repeated `bytes` field is one (tag, length, bytes) record per element. So a ModelInferResponse is
protobuf's own serialization of everything but raw_output_contents, followed by one record per
output written here from a view of the output array. Through protobuf instead, each output would
be copied into a bytes object (upb takes no memoryview), then into the message, then into the
serialized string: three copies before grpcio's own; here it is one join (measured in the README).
grpcio's serializer must return `bytes`, and it copies those into its send buffer: that join and
that copy are the floor. Field numbers come from the message descriptors, not from this file.

Requests the other way (`parse_infer`): protobuf copied each raw input out of grpc's bytes into its own
message, and `raw_input_contents[i]` copied it again into a bytes object; a 61 MiB ModelInfer peaked at
+371 MiB (6.1x). Here the records of raw_input_contents become views of the bytes grpc hands over
(which grpc holds until the call ends anyway), and protobuf parses the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import service_pb2 as pb

LENGTH_DELIMITED = 2  # protobuf's wire type of bytes and embedded messages


def _tag(message: Any, field: str) -> bytes:
    return varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | LENGTH_DELIMITED)


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative integer."""
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


RAW_OUTPUT = _tag(pb.ModelInferResponse, "raw_output_contents")
STREAM_RESPONSE = _tag(pb.ModelStreamInferResponse, "infer_response")


@dataclass
class Encoded:
    """A ModelInferResponse: its fields serialized by protobuf (head) and its raw outputs as views (raws)."""

    head: bytes
    raws: tuple[memoryview, ...]

    def parts(self) -> list[bytes | memoryview]:
        out: list[bytes | memoryview] = [self.head]
        for raw in self.raws:
            out += [RAW_OUTPUT + varint(raw.nbytes), raw]
        return out

    @property
    def length(self) -> int:
        return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in self.parts())


def serialize_infer(response: Encoded | Any) -> bytes:
    """ModelInfer's response serializer: an Encoded answer joined once, or any protobuf message.

    The views go once joined: grpc holds the response until the call ends, and the output arrays with it."""
    if isinstance(response, Encoded):
        parts, response.raws = response.parts(), ()
        return b"".join(parts)
    data: bytes = response.SerializeToString()
    return data


def serialize_stream(response: Encoded | Any) -> bytes:
    """ModelStreamInfer's: an Encoded answer inside a ModelStreamInferResponse, or an error's message."""
    if isinstance(response, Encoded):
        return b"".join([STREAM_RESPONSE, varint(response.length), *response.parts()])
    data: bytes = response.SerializeToString()
    return data


def size(response: Encoded | Any) -> int:
    """Bytes on the wire of an answer (before grpc's framing and compression), for the log line."""
    return response.length if isinstance(response, Encoded) else int(response.ByteSize())


RAW_INPUT = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number
# Top-level records scanned in Python at most: a client's message of a million tiny fields is left to protobuf.
MAX_RECORDS = 4096


class InferMessage:
    """A ModelInferRequest read as protobuf would, its raw_input_contents views of the received bytes."""

    def __init__(self, head: Any, raws: list[memoryview], size: int) -> None:
        self._head = head
        self.raw_input_contents = raws
        self._size = size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._head, name)

    def ByteSize(self) -> int:  # noqa: N802 (protobuf's name)
        return self._size


def parse_infer(data: bytes) -> Any:
    """ModelInfer's request deserializer: an InferMessage, or protobuf's own reading (and DecodeError) of a
    message without raw inputs, past MAX_RECORDS, or not framed as protobuf frames it."""
    try:
        head, raws = _split_raw_inputs(data)
    except _Unframed:
        raws = []
    if not raws:  # nothing to gain; and typed contents then stay no copy of a head
        return pb.ModelInferRequest.FromString(data)
    return InferMessage(pb.ModelInferRequest.FromString(head), raws, len(data))


class _Unframed(Exception):
    """Past what _split_raw_inputs reads: left to protobuf, whose error message a client then gets."""


def _split_raw_inputs(data: bytes) -> tuple[bytes, list[memoryview]]:
    """The message without its raw_input_contents records, and their contents as views of data."""
    view, head, raws, pos = memoryview(data), bytearray(), list[memoryview](), 0
    for _ in range(MAX_RECORDS):
        if pos == len(data):
            return bytes(head), raws
        start = pos
        key, pos = _varint(data, pos)
        if key & 7 == LENGTH_DELIMITED:
            length, pos = _varint(data, pos)
            if key >> 3 == RAW_INPUT and pos + length <= len(data):
                raws.append(view[pos : pos + length])
                pos += length
                continue
            pos += length
        elif key & 7 in FIXED:
            pos += FIXED[key & 7]
        elif key & 7 == 0:
            pos = _varint(data, pos)[1]
        else:  # a group (proto2), or not protobuf
            raise _Unframed
        if pos > len(data):
            raise _Unframed
        head += view[start:pos]
    raise _Unframed


FIXED = {1: 8, 5: 4}  # wire types 64-bit and 32-bit: their sizes


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """Protobuf's varint at pos: (value, the position after it)."""
    value = shift = 0
    while pos < len(data) and shift < 70:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise _Unframed
