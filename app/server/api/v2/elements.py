"""An input's elements, wherever its transport put them, into the array the model's kind reads.

HTTP carries them as JSON `data` or as a section of the binary part after the JSON header
(`parameters.binary_data_size`); gRPC as raw_input_contents or typed contents. app/server/api/v2/rules.py's
`decode` calls these once an input's name, datatype, shape and parameters are checked; each checks that
the elements fill the shape and names the field that carried them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from app.core.halfprecision import HALF_DTYPES, narrow
from app.core.model import TensorSpec
from app.core.tensors import DATATYPES, decode_binary, decode_json_tensor
from app.errors import InvalidInput, MalformedBody, shown
from app.server.api.v2 import strings
from app.server.api.v2.request import Contents, Inline
from app.settings import Settings

HEADER_LENGTH = "Inference-Header-Content-Length"
RAW = "raw_input_contents"
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


def of_body(
    data: Inline | Contents | None,
    params: dict[str, Any],
    rest: memoryview,
    spec: TensorSpec,
    header: tuple[str, list[int]],
    settings: Settings,
    may_hold_bools: bool,
) -> tuple[np.ndarray, int]:
    """An HTTP input: (array, bytes it took from `rest`, the binary part not taken by the inputs before it)."""
    (datatype, shape), field = header, f"inputs.{spec.name}"
    if "binary_data_size" not in params:
        if not isinstance(data, Inline):
            raise InvalidInput("expected `data`, or parameters.binary_data_size with binary data", field)
        if datatype == "BYTES":
            return _strings(data.value, shape, f"{field}.data"), 0
        return _from_json(data.value, datatype, shape, field, settings, may_hold_bools), 0
    if data is not None:
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
    return from_raw(rest[:size], spec, datatype, shape, f"{field}.parameters.binary_data_size"), size


def of_message(
    data: Inline | Contents | None, raw: bytes | None, spec: TensorSpec, header: tuple[str, list[int]]
) -> np.ndarray:
    """A gRPC input: its raw_input_contents, or the typed contents field of its datatype."""
    (datatype, shape), field = header, f"inputs.{spec.name}"
    typed = CONTENTS[datatype]
    if raw is not None:
        if data is not None:
            raise InvalidInput(f"has both contents and {RAW}; send one", field)
        return from_raw(raw, spec, datatype, shape, field, RAW)
    if not isinstance(data, Contents):
        raise InvalidInput(f"expected contents.{typed}, or {RAW}", field)
    others = [name for name in data.fields if name != typed]
    if others:
        raise InvalidInput(f"{others[0]} cannot hold {datatype}; expected {typed}", f"{field}.contents")
    values = data.fields.get(typed, ())
    check_count(len(values), shape, f"{field}.contents.{typed}")
    if datatype == "BYTES":
        texts = [strings.utf8(v, f"{field}[{i}]") for i, v in enumerate(values)]
        return np.array(texts, dtype=object).reshape(shape)
    arr = np.array(values, dtype=DATATYPES["FP32" if datatype in HALF_DTYPES else datatype]).reshape(shape)
    return from_numbers(arr, datatype, field)


def from_raw(
    raw: memoryview | bytes,
    spec: TensorSpec,
    datatype: str,
    shape: list[int],
    field: str,
    size_name: str = "binary_data_size",
) -> np.ndarray:
    """Raw little-endian bytes -> the input: its byte count must match the shape.

    BOOL: any nonzero byte is true, as C and NumPy read a byte (perf_analyzer's random data sends any byte).
    A number tensor is a view of the raw bytes, no copy (peak RSS): the data plane's input checks and casts it."""
    if datatype == "BYTES":
        items = strings.from_raw(raw, field, f"inputs.{spec.name}")
        check_count(len(items), shape, f"{field}.{size_name}")
        return np.array(items, dtype=object).reshape(shape)
    arr = decode_binary(raw, datatype, shape, field, size_name)
    if datatype == "BOOL":
        truth: np.ndarray = arr.view(np.uint8) != 0  # a new array: the request's memory is not the data plane's
        return truth
    return arr


def from_numbers(arr: np.ndarray, datatype: str, field: str) -> np.ndarray:
    """Numbers sent inline (JSON data, gRPC fp32_contents) for a half-precision tensor, rounded to it as Triton
    reads FP16 JSON; a number beyond its range is refused naming the field, not sent on as inf."""
    return narrow(arr, datatype, field) if datatype in HALF_DTYPES else arr


def check_count(count: int, shape: list[int], field: str) -> None:
    """Elements sent inline (JSON `data`, gRPC typed contents) must fill the shape: only the count must match."""
    if count != math.prod(shape):
        raise InvalidInput(f"{count} elements, but shape {shape} needs {math.prod(shape)}", field)


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
    check_count(arr.size, shape, f"{field}.data")
    return from_numbers(arr.reshape(shape), datatype, field)


def _strings(data: Any, shape: list[int], field: str) -> np.ndarray:
    """A BYTES tensor in JSON: a flat list of strings (as tritonclient sends it), each element a text."""
    if not isinstance(data, list):
        raise InvalidInput(f"{shown(data)}; expected a list of strings", field)
    for i, item in enumerate(data):
        if not isinstance(item, str):
            raise InvalidInput(f"{shown(item)}; expected a string", f"{field}[{i}]")
    check_count(len(data), shape, field)
    return np.array(data, dtype=object).reshape(shape)
