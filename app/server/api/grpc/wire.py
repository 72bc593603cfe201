"""Infer responses on the wire: protobuf for the fields, the output tensors appended from their arrays.

A protobuf message's encoding is the concatenation of its fields' encodings, in any order, and a
repeated `bytes` field is one (tag, length, bytes) record per element. So a ModelInferResponse is
protobuf's own serialization of everything but raw_output_contents, followed by one record per
output written here from a view of the output array. Through protobuf instead, each output would
be copied into a bytes object (upb takes no memoryview), then into the message, then into the
serialized string: three copies before grpcio's own; here it is one join (measured in the README).
grpcio's serializer must return `bytes`, and it copies those into its send buffer: that join and
that copy are the floor. Field numbers come from the message descriptors, not from this file.
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


@dataclass(frozen=True)
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
    """ModelInfer's response serializer: an Encoded answer joined once, or any protobuf message."""
    if isinstance(response, Encoded):
        return b"".join(response.parts())
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
