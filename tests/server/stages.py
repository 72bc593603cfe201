"""A codec of plain functions (app/server/pipeline.py's Codec), as a test hands Worker.serve or a Job."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.core.model import Model


class Stages:
    """decode and encode as given; `model` the one the request names before its body (V2's URL), if any."""

    def __init__(
        self,
        decode: Callable[[Any], tuple[Model, Any, Any]],
        encode: Callable[[Any, Any], Any] = lambda _, out: out,
        model: Model | None = None,
        size: int = 0,
    ) -> None:
        self.decoder, self.encoder, self.model, self.bytes = decode, encode, model, size

    def size(self, body: Any) -> int:
        return self.bytes

    def decode(self, body: Any) -> tuple[Model, Any, Any]:
        return self.decoder(body)

    def encode(self, wire: Any, result: Any) -> Any:
        return self.encoder(wire, result)
