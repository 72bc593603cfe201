"""A REST body read as far as the model it names: its small fields checked by their pydantic model, its tensors
found but not yet parsed into the model's input (app/server/api/rest/codec.py does that once the data plane has
found the model)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from app.core import jsontensors
from app.core.jsonkeys import check_unique_keys, duplicate_key, first_duplicate_key
from app.core.tensors import loads
from app.errors import InvalidInput, shown

# A body up to this size is kept until decoded rather than scanned and emptied as soon as its tensors are parsed:
# the early release saves no memory worth its two scans of the body (5 us of a small /normalize, measured).
KEEP_BODY_BYTES = 1 << 16


@dataclass
class Parsed:
    """A body read as far as the model it names: its small fields checked, its tensors not yet parsed."""

    params: Any  # NormalizeParams or EncodeParams
    tensors: dict[str, Any]
    scan: _Scan


def read(body: bytes | bytearray, kind: type[BaseModel], tensor_names: tuple[str, ...]) -> Parsed:
    fields, tensors, scan = _split(body, tensor_names)
    return Parsed(_validate(kind, fields, tensor_names), tensors, scan)


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


def may_hold_bools(scan: _Scan, tensors: dict[str, Any]) -> bool:
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
