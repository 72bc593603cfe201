"""The REST protocol's codec: /normalize and /encode bodies to the data plane's inputs, and its outputs to JSON.

Tensors go through the tensor codecs straight into NumPy; pydantic checks the types of the
small fields only. Every rule of a value (eps, k, shapes, finiteness, the encoder's limits)
is the data plane's, checked when the input is built (app/core/dataplane.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.core import jsontensors
from app.core.dataplane import EncodeInput, EncodeOutput, Fields, NormalizeInput, NormalizeOutput
from app.core.encoder import EncoderModel
from app.core.halfprecision import HALF_DTYPES, JSON_DTYPES, narrow, printable
from app.core.jsonkeys import check_unique_keys, duplicate_key, first_duplicate_key
from app.core.layernorm import LayerNormModel
from app.core.model import Model
from app.core.tensors import decode_json_tensor, dumps, encode_json_tensor, loads
from app.errors import InvalidInput, shown
from app.settings import Settings

TENSOR_DOC = "A nested array of numbers (rank >= 1, rectangular); parsed straight into NumPy."
FIELDS = Fields()  # the data plane's own names are the REST ones
# A body up to this size is kept until decoded rather than scanned and emptied as soon as its tensors are parsed:
# the early release saves no memory worth its two scans of the body (5 us of a small /normalize, measured).
KEEP_BODY_BYTES = 1 << 16
DTYPE_DOC = (
    "The numbers' type: data, gamma and beta are rounded to it (a number beyond its range is a 422), and output is"
    " computed from those values and rounded once to it."
)


class NormalizeParams(BaseModel):
    """The small fields of a /normalize request: their types (the data plane checks their values)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    model: str = Field("layernorm", description="A layernorm model of the repository.")
    version: int | str | None = Field(None, description="A version of it; default the highest ready one.")
    normalized_shape: int | list[int] | None = Field(
        None, description="Trailing dims of data; default its last dim (a learned model's normalized_shape)."
    )
    eps: float | None = Field(
        None, description="Added to var (mode var) or std (mode std); a finite number > 0; default 1e-5."
    )
    eps_mode: str = Field(
        "var", description="var: sqrt(var + eps); std: sqrt(var) + eps.", json_schema_extra={"enum": ["var", "std"]}
    )
    backend: Literal["onnxruntime", "numpy"] = Field("onnxruntime", description="Which path computes `output`.")
    validate_: bool = Field(False, alias="validate", description="Also run the other backend and report the diff.")
    dtype: Literal["float32", "float16", "bfloat16"] = Field("float32", description=DTYPE_DOC)


class EncodeParams(BaseModel):
    """The small fields of an /encode request."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    model: str = Field("encoder", description="An encoder of the repository: encoder (post-LN), encoder-preln, ...")
    version: int | str | None = Field(None, description="A version of it; default the highest ready one.")
    validate_: bool = Field(False, alias="validate", description="Also run the NumPy reference and report the diff.")
    dtype: Literal["float32", "float16", "bfloat16"] = Field("float32", description=DTYPE_DOC)


NORMALIZE_TENSORS = ("data", "gamma", "beta")
ENCODE_TENSORS = ("data", "padding_mask")


Resolve = Callable[[str, int | str | None], Model]  # (model, version) -> the serving model, or 404


def decode_normalize(
    body: bytes | bytearray, settings: Settings, resolve: Resolve
) -> tuple[LayerNormModel, NormalizeInput]:
    """The layernorm model named by `model` and `version`, and its input with the model's defaults."""
    fields, tensors, scan = _split(body, NORMALIZE_TENSORS)
    params = _validate(NormalizeParams, fields, NORMALIZE_TENSORS)
    model = resolve(params.model, params.version)
    if not isinstance(model, LayerNormModel):
        raise InvalidInput(f"{params.model!r} is of kind {model.kind}; /normalize takes a layernorm model", "model")
    may_hold_bools = _may_hold_bools(scan, tensors)
    dtype = JSON_DTYPES.get(params.dtype, "FP32")
    numbers = {n: _numbers(tensors[n], n, settings, may_hold_bools) for n in NORMALIZE_TENSORS if n in tensors}
    x, gamma, beta = (_rounded(numbers[n], n, dtype) if n in numbers else None for n in NORMALIZE_TENSORS)
    sent = numbers["data"]
    assert x is not None
    k = _trailing_dims(params.normalized_shape, sent.shape)
    scan.check_unique_keys()  # last, when the body is known to hold only numbers besides the fields
    args = (params.eps, params.eps_mode, gamma, beta, params.backend, params.validate_, FIELDS, dtype)
    # The numbers as sent go along: the rows that rounding to a half type made constant are warned of.
    return model, model.request(x, k, *args, sent=sent)


def encode_normalize(out: NormalizeOutput) -> bytes:
    doc: dict[str, Any] = {
        "output": encode_json_tensor(printable(out.output)),
        "shape": list(out.output.shape),
        "stats": {
            "mean": encode_json_tensor(out.mean),
            "var": encode_json_tensor(out.var),
            "std": encode_json_tensor(out.std),
        },
        "backend": out.backend,
        "model": out.model.describe() if out.model else None,
    }
    if out.validation is not None:
        doc["validation"] = out.validation
    if out.warnings:  # only when there are some: the answers clients already parse stay as they were
        doc["warnings"] = list(out.warnings)
    return dumps(doc)


def decode_encode(
    body: bytes | bytearray, settings: Settings, resolve: Resolve
) -> tuple[EncoderModel, EncodeInput, bool]:
    """The encoder named by `model`, its input as (B,T,C), and whether the caller sent a 2-D (T,C) tensor."""
    fields, tensors, scan = _split(body, ENCODE_TENSORS)
    params = _validate(EncodeParams, fields, ENCODE_TENSORS)
    model = resolve(params.model, params.version)
    if not isinstance(model, EncoderModel):
        raise InvalidInput(f"{params.model!r} is of kind {model.kind}; /encode takes an encoder model", "model")
    dtype = JSON_DTYPES.get(params.dtype, "FP32")
    x = _rounded(_numbers(tensors["data"], "data", settings, _may_hold_bools(scan, tensors)), "data", dtype)
    mask = None
    if tensors.get("padding_mask") is not None:
        mask = decode_json_tensor(
            tensors["padding_mask"],
            "padding_mask",
            max_elements=settings.max_elements,
            max_depth=settings.max_depth,
            boolean=True,
        )
    scan.check_unique_keys()
    req = EncodeInput(x, mask, model.limits, params.validate_, FIELDS, one_sequence=True, dtype=dtype)
    return model, req, x.ndim == 2  # [seq, d_model]: answered without the batch dim


def encode_encode(squeeze: bool, out: EncodeOutput) -> bytes:
    def shaped(a: np.ndarray) -> Any:
        return encode_json_tensor(printable(a[0] if squeeze else a))

    doc: dict[str, Any] = {
        "output": shaped(out.output),
        "shape": list(out.output.shape[1:] if squeeze else out.output.shape),
        "layer_norms": [{"name": n, "mean": shaped(m), "std": shaped(s)} for n, m, s in out.layer_norms],
        "model": out.model.describe(),
    }
    if out.validation is not None:
        doc["validation"] = out.validation
    return dumps(doc)


class RestCodec:
    """A REST request for Worker.serve (app/server/pipeline.py's Codec): one per request, its `model` once
    the body names it."""

    def __init__(self, lookup: Resolve, settings: Settings) -> None:
        self.lookup = lookup  # the Worker's: 404 for an unknown model, 503 while the models are loading
        self.settings = settings
        self.model: Model | None = None

    def size(self, body: bytes | bytearray) -> int:
        return len(body)

    def resolve(self, name: str, version: int | str | None) -> Model:
        """The serving model a body names; the request, even one that then fails to decode, counts for it."""
        self.model = self.lookup(name, version)
        return self.model


class NormalizeCodec(RestCodec):
    def decode(self, body: bytes | bytearray) -> tuple[Model, NormalizeInput, None]:
        model, req = decode_normalize(body, self.settings, self.resolve)
        return model, req, None

    def encode(self, wire: None, result: NormalizeOutput) -> bytes:
        return encode_normalize(result)


class EncodeCodec(RestCodec):
    def decode(self, body: bytes | bytearray) -> tuple[Model, EncodeInput, bool]:
        return decode_encode(body, self.settings, self.resolve)  # bool: answer [seq, d_model] without batch

    def encode(self, wire: bool, result: EncodeOutput) -> bytes:
        return encode_encode(wire, result)


class _Scan:
    """What the codec still asks of a body once its tensors are parsed: a fast-path body is scanned then emptied
    (the route holds it no longer), before the float64 buffers exist. A small body is kept instead, and not
    scanned for repeated keys when the fast path saw every object's keys itself (`walked`)."""

    def __init__(self, body: bytes | bytearray) -> None:
        self.body = body
        self.bools: bool | None = None
        self.duplicate: str | None = None
        self.walked = False

    def release(self) -> None:
        # true/false matter only in a tensor the fast path left as lists, rare, where `bools` then makes the codec
        # check each element: cheaper than two scans of every large body (9 of 42 ms decoding 8.6 MB, measured).
        self.bools = True
        self.duplicate = first_duplicate_key(self.body)
        if isinstance(self.body, bytearray):
            self.body.clear()

    def has_bools(self) -> bool:
        return self.bools if self.bools is not None else (b"true" in self.body or b"false" in self.body)

    def check_unique_keys(self) -> None:
        if self.walked:
            return
        if self.bools is None:
            check_unique_keys(self.body)
        elif self.duplicate is not None:
            raise duplicate_key(self.duplicate)


def _split(body: bytes | bytearray, tensor_names: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any], _Scan]:
    # Tensors straight into NumPy when the fast path is sure of them; orjson (and its messages) otherwise.
    scan = _Scan(body)
    small = len(body) <= KEEP_BODY_BYTES
    doc = jsontensors.loads(
        body, lambda path: len(path) == 1 and path[0] in tensor_names, None if small else scan.release
    )
    fast = doc is not None
    if doc is None:
        doc = loads(body)
    if not isinstance(doc, dict):
        raise InvalidInput("expected a JSON object with a `data` field", "body")
    tensors = {name: doc.pop(name) for name in tensor_names if name in doc}
    if "data" not in tensors:
        raise InvalidInput("field required: a nested array of numbers", "data")
    # The fast path refused a repeated key in every object it converted: all of them, unless a tensor came back
    # as lists (simdjson's as_list, whose objects it never saw).
    scan.walked = small and fast and not any(isinstance(v, list) for v in tensors.values())
    return doc, tensors, scan


def _may_hold_bools(scan: _Scan, tensors: dict[str, Any]) -> bool:
    # Arrays the fast path parsed hold numbers only; the body is scanned for true/false only for lists.
    return any(isinstance(v, list) for v in tensors.values()) and scan.has_bools()


def _validate(model: type[BaseModel], fields: dict[str, Any], tensor_names: tuple[str, ...]) -> Any:
    # Unknown fields before pydantic, which would list every one of them: a body of a million unknown keys
    # spent 2 s of CPU building the error list, to report its first entry.
    known = [*tensor_names, *(f.alias or n for n, f in model.model_fields.items())]
    for name in fields:
        if name not in known:
            raise InvalidInput(f"unknown field; expected only {', '.join(known)}", name)
    if not fields:  # most bodies send tensors alone: their parameters are the defaults, validated once
        return _defaults(model)
    try:
        return model.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "body"
        if name == "normalized_shape":
            raise InvalidInput("expected an int or a list of ints", name) from None
        raise InvalidInput(f"{err['msg']} (got {shown(err.get('input'))})", name) from None


@functools.cache
def _defaults(model: type[BaseModel]) -> Any:
    return model.model_validate({})


def _numbers(value: Any, name: str, settings: Settings, may_hold_bools: bool) -> np.ndarray:
    """A tensor's numbers, as sent."""
    return decode_json_tensor(
        value, name, max_elements=settings.max_elements, max_depth=settings.max_depth, may_hold_bools=may_hold_bools
    )


def _rounded(arr: np.ndarray, name: str, dtype: str) -> np.ndarray:
    """A tensor's numbers rounded to the request's half type where it names one."""
    return narrow(arr, dtype, name) if dtype in HALF_DTYPES else arr


def _trailing_dims(normalized_shape: int | list[int] | None, shape: tuple[int, ...]) -> int | None:
    """k, the number of trailing dims normalized, checking normalized_shape against data's shape (None: the model's)."""
    if normalized_shape is None:
        return None
    dims = [normalized_shape] if isinstance(normalized_shape, int) else normalized_shape
    k = len(dims)
    if k == 0 or k > len(shape) or tuple(dims) != shape[len(shape) - k :]:
        raise InvalidInput(
            f"{dims} is not the trailing dims of data's shape {list(shape)}; "
            f"expected e.g. {list(shape[-1:])} or {list(shape[-min(2, len(shape)) :])}",
            "normalized_shape",
        )
    return k
