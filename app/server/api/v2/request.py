"""An Open Inference Protocol infer request as one plain value, whichever transport carried it.

The HTTP codec (app/server/api/v2/http/codec.py) and the gRPC codec (app/server/api/v2/grpc/codec.py)
each read their wire into a V2Request and check nothing the wire itself does not decide (JSON syntax,
the JSON header's byte count); app/server/api/v2/rules.py's `decode` then checks all of it in one pass.
Fields hold what was sent, unchecked (`Any` where a client may send anything), and tensor data located
but not decoded: JSON numbers as the fast path parsed them, raw bytes as views of the body or message.
Named tuples, not frozen dataclasses: a small JSON request of two inputs builds five values, 6.4 us as
frozen dataclasses and 3.1 us as named tuples (timeit, one core), of a decode of ~200 us.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple


class Inline(NamedTuple):
    """A tensor's elements in the request itself: HTTP's JSON `data` (lists, or NumPy from app/core/jsontensors.py)."""

    value: Any


class Contents(NamedTuple):
    """gRPC's typed contents (InferTensorContents): each field set in the message, by name."""

    fields: Mapping[str, Sequence[Any]]


class V2Input(NamedTuple):
    name: Any
    datatype: Any
    shape: Any
    parameters: Any = None  # None: none sent
    data: Inline | Contents | None = None  # None: none in the tensor itself (its bytes may come raw or binary)


class V2Output(NamedTuple):
    """A requested output: a pair, as app/server/api/v2/rules.py's requested_outputs reads them."""

    name: Any
    parameters: Any = None


class JsonHeader(NamedTuple):
    """A JSON header as sent (HTTP): its keys must be unique (app/core/jsonkeys.py), a check left until the
    rest is valid, when its tensors are known to be plain numbers and the scan is one cheap pass."""

    body: bytes | bytearray
    end: int  # the header is body[:end]
    may_hold_bools: bool  # False: no true/false token in it, so inline numbers need no check for booleans


class V2Request(NamedTuple):
    id: str | None
    parameters: Any  # None: none sent
    inputs: Sequence[V2Input]  # empty, also when the wire's `inputs` were not a list
    outputs: Sequence[V2Output] | None = ()  # none named: every output; None: the wire's were not a list
    model_name: Any = None  # HTTP's body may name the URL's model again (KServe's client does); None: not sent
    model_version: Any = None
    # HTTP: the bytes after the JSON header, cut by each input's binary_data_size in order (empty: none follow);
    # None: the transport carries each input's bytes itself (gRPC), and its inputs' elements are read as gRPC's.
    binary: memoryview | None = None
    raw: Sequence[bytes] = ()  # gRPC: raw_input_contents, one per input in order, or none
    binary_outputs: bool = False  # HTTP: outputs may go as binary data (binary_data_output, binary_data)
    json: JsonHeader | None = None
