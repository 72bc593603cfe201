"""The REST requests of /normalize and /encode: tensors via the codecs, the small fields via pydantic."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.core import jsontensors
from app.core.dataplane import EncodeInput, NormalizeInput
from app.core.jsonkeys import check_unique_keys
from app.core.tensors import decode_json_tensor, loads
from app.errors import InvalidInput
from app.settings import Settings

TENSOR_DOC = "A nested array of numbers (rank >= 1, rectangular); parsed straight into NumPy."


class NormalizeParams(BaseModel):
    """The small fields of a /normalize request, validated by pydantic."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    normalized_shape: int | list[int] | None = Field(None, description="Trailing dims of data; default its last dim.")
    eps: float = Field(1e-5, gt=0, allow_inf_nan=False, description="Added to var (mode var) or std (mode std).")
    eps_mode: Literal["var", "std"] = Field("var", description="var: sqrt(var + eps); std: sqrt(var) + eps.")
    backend: Literal["onnxruntime", "numpy"] = Field("onnxruntime", description="Which path computes `output`.")
    validate_: bool = Field(False, alias="validate", description="Also run the other backend and report the diff.")


class EncodeParams(BaseModel):
    """The small fields of an /encode request."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    model: str = Field("encoder", description="encoder (post-LN) or encoder-preln.")
    validate_: bool = Field(False, alias="validate", description="Also run the NumPy reference and report the diff.")


NORMALIZE_TENSORS = ("data", "gamma", "beta")
ENCODE_TENSORS = ("data", "padding_mask")


def parse_normalize(body: bytes | bytearray, settings: Settings) -> NormalizeInput:
    fields, tensors = _split(body, NORMALIZE_TENSORS)
    params = _validate(NormalizeParams, fields, NORMALIZE_TENSORS)
    may_hold_bools = _may_hold_bools(body, tensors)
    x = _tensor(tensors, "data", settings, may_hold_bools)
    k = _trailing_dims(params.normalized_shape, x.shape)
    gamma, beta = (
        _tensor(tensors, name, settings, may_hold_bools, expect=x.shape[-k:]) if name in tensors else None
        for name in ("gamma", "beta")
    )
    check_unique_keys(body)  # last, when the body is known to hold only numbers besides the fields
    return NormalizeInput(x, k, params.eps, params.eps_mode, gamma, beta, params.backend, params.validate_)


def parse_encode(body: bytes | bytearray, settings: Settings) -> tuple[EncodeInput, bool]:
    """The encoder input as (B,T,C) and whether the caller sent a 2-D (T,C) tensor."""
    fields, tensors = _split(body, ENCODE_TENSORS)
    params = _validate(EncodeParams, fields, ENCODE_TENSORS)
    x = _tensor(tensors, "data", settings, _may_hold_bools(body, tensors))
    if x.ndim not in (2, 3):
        raise InvalidInput(
            f"rank {x.ndim} (shape {list(x.shape)}); expected [batch, seq, d_model] or [seq, d_model]", "data"
        )
    mask = None
    if tensors.get("padding_mask") is not None:
        mask = decode_json_tensor(
            tensors["padding_mask"],
            "padding_mask",
            max_elements=settings.max_elements,
            max_depth=settings.max_depth,
            dtype=np.bool_,
        )
    check_unique_keys(body)
    squeeze = x.ndim == 2
    if squeeze:
        x = x[None]
        mask = mask[None] if mask is not None and mask.ndim == 1 else mask
    return EncodeInput(x, mask, params.model, params.validate_), squeeze


def _split(body: bytes | bytearray, tensor_names: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    # Tensors straight into NumPy when the fast path is sure of them; orjson (and its messages) otherwise.
    doc = jsontensors.loads(body, lambda path: len(path) == 1 and path[0] in tensor_names)
    if doc is None:
        doc = loads(body)
    if not isinstance(doc, dict):
        raise InvalidInput("expected a JSON object with a `data` field", "body")
    tensors = {name: doc.pop(name) for name in tensor_names if name in doc}
    if "data" not in tensors:
        raise InvalidInput("field required: a nested array of numbers", "data")
    return doc, tensors


def _may_hold_bools(body: bytes | bytearray, tensors: dict[str, Any]) -> bool:
    # Arrays the fast path parsed hold numbers only; the body is scanned for true/false only for lists.
    return any(isinstance(v, list) for v in tensors.values()) and (b"true" in body or b"false" in body)


def _validate(model: type[BaseModel], fields: dict[str, Any], tensor_names: tuple[str, ...]) -> Any:
    try:
        return model.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "body"
        if err["type"] == "extra_forbidden":
            known = ", ".join([*tensor_names, *(f.alias or n for n, f in model.model_fields.items())])
            raise InvalidInput(f"unknown field; expected only {known}", name) from None
        if name == "normalized_shape":
            raise InvalidInput("expected an int or a list of ints", name) from None
        raise InvalidInput(f"{err['msg']} (got {err.get('input')!r})", name) from None


def _tensor(
    tensors: dict[str, Any], name: str, settings: Settings, may_hold_bools: bool, expect: tuple[int, ...] | None = None
) -> np.ndarray:
    arr = decode_json_tensor(
        tensors[name],
        name,
        max_elements=settings.max_elements,
        max_depth=settings.max_depth,
        may_hold_bools=may_hold_bools,
    )
    if expect is not None and arr.shape != expect:
        raise InvalidInput(f"shape {list(arr.shape)} does not match normalized_shape {list(expect)}", name)
    return arr


def _trailing_dims(normalized_shape: int | list[int] | None, shape: tuple[int, ...]) -> int:
    """k, the number of trailing dims normalized, checking normalized_shape against data's shape."""
    if normalized_shape is None:
        return 1
    dims = [normalized_shape] if isinstance(normalized_shape, int) else normalized_shape
    k = len(dims)
    if k == 0 or k > len(shape) or tuple(dims) != shape[len(shape) - k :]:
        raise InvalidInput(
            f"{dims} is not the trailing dims of data's shape {list(shape)}; "
            f"expected e.g. {list(shape[-1:])} or {list(shape[-min(2, len(shape)) :])}",
            "normalized_shape",
        )
    return k
