"""The REST protocol's codec: /normalize and /encode bodies to the data plane's inputs, and its outputs to JSON.

A body is read as far as the model it names first (app/server/api/rest/fields.py); its tensors go through the
tensor codecs straight into NumPy; pydantic checks the types of the small fields only. Every rule of a value
(eps, k, shapes, finiteness, the encoder's limits) is the data plane's, checked when the input is built
(app/core/dataplane.py).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from app.core.dataplane import EncodeInput, EncodeOutput, Fields, NormalizeInput, NormalizeOutput
from app.core.encoder import EncoderModel
from app.core.halfprecision import HALF_DTYPES, JSON_DTYPES, narrow, printable
from app.core.layernorm import LayerNormModel
from app.core.model import Model
from app.core.tensors import decode_json_tensor, dumps, encode_json_tensor
from app.errors import InvalidInput
from app.server.api.rest import fields
from app.server.api.rest.fields import Parsed
from app.settings import Settings

TENSOR_DOC = "A nested array of numbers (rank >= 1, rectangular); parsed straight into NumPy."
FIELDS = Fields()  # the data plane's own names are the REST ones
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


def decode_normalize(parsed: Parsed, model: Model, settings: Settings) -> NormalizeInput:
    """The input of the layernorm model the body named (`model` and `version`), with the model's defaults."""
    params, tensors, scan = parsed.params, parsed.tensors, parsed.scan
    if not isinstance(model, LayerNormModel):
        raise InvalidInput(f"{params.model!r} is of kind {model.kind}; /normalize takes a layernorm model", "model")
    bools = fields.may_hold_bools(scan, tensors)
    dtype = JSON_DTYPES.get(params.dtype, "FP32")
    numbers = {n: _numbers(tensors[n], n, settings, bools) for n in NORMALIZE_TENSORS if n in tensors}
    x, gamma, beta = (_rounded(numbers[n], n, dtype) if n in numbers else None for n in NORMALIZE_TENSORS)
    sent = numbers["data"]
    assert x is not None
    k = _trailing_dims(params.normalized_shape, sent.shape)
    scan.check_unique_keys()  # last, when the body is known to hold only numbers besides the fields
    args = (params.eps, params.eps_mode, gamma, beta, params.backend, params.validate_, FIELDS, dtype)
    # The numbers as sent go along: the rows that rounding to a half type made constant are warned of.
    return model.request(x, k, *args, sent=sent)


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


def decode_encode(parsed: Parsed, model: Model, settings: Settings) -> tuple[EncodeInput, bool]:
    """The input of the encoder the body named, as (B,T,C), and whether the caller sent a 2-D (T,C) tensor."""
    params, tensors, scan = parsed.params, parsed.tensors, parsed.scan
    if not isinstance(model, EncoderModel):
        raise InvalidInput(f"{params.model!r} is of kind {model.kind}; /encode takes an encoder model", "model")
    dtype = JSON_DTYPES.get(params.dtype, "FP32")
    x = _rounded(_numbers(tensors["data"], "data", settings, fields.may_hold_bools(scan, tensors)), "data", dtype)
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
    return req, x.ndim == 2  # [seq, d_model]: answered without the batch dim


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
    """A REST request for DataPlane.infer (app/server/pipeline.py's Codec): one per request; its body names its
    model (`target`), which the data plane finds before `decode`."""

    named = None  # the body names the model
    PARAMS: type[BaseModel]
    TENSORS: tuple[str, ...]

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.parsed: Parsed | None = None

    def size(self, body: bytes | bytearray) -> int:
        return len(body)

    def target(self, body: bytes | bytearray) -> tuple[str, int | str | None]:
        self.parsed = fields.read(body, self.PARAMS, self.TENSORS)
        return self.parsed.params.model, self.parsed.params.version

    def _parsed(self, body: bytes | bytearray) -> Parsed:
        parsed, self.parsed = self.parsed or fields.read(body, self.PARAMS, self.TENSORS), None
        return parsed


class NormalizeCodec(RestCodec):
    PARAMS, TENSORS = NormalizeParams, NORMALIZE_TENSORS

    def decode(self, body: bytes | bytearray, model: Model) -> tuple[NormalizeInput, None]:
        return decode_normalize(self._parsed(body), model, self.settings), None

    def encode(self, model: Model, wire: None, result: NormalizeOutput) -> bytes:
        return encode_normalize(result)


class EncodeCodec(RestCodec):
    PARAMS, TENSORS = EncodeParams, ENCODE_TENSORS

    def decode(self, body: bytes | bytearray, model: Model) -> tuple[EncodeInput, bool]:
        return decode_encode(self._parsed(body), model, self.settings)  # bool: answer [seq, d_model] without batch

    def encode(self, model: Model, wire: bool, result: EncodeOutput) -> bytes:
        return encode_encode(wire, result)


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
