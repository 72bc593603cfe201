"""A codec of plain functions (app/server/pipeline.py's Codec), as a test hands DataPlane.infer or a Job."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.core.model import Model

Version = str | int | None


class Stages:
    """decode and encode as given; `model` the one the request names before its body (V2's URL), if any, else
    the one decode's result names (as a REST body names it)."""

    def __init__(
        self,
        decode: Callable[[Any], tuple[Model, Any, Any]],
        encode: Callable[[Any, Any], Any] = lambda _, out: out,
        model: Model | None = None,
        size: int = 0,
    ) -> None:
        self.decoder, self.encoder, self.bytes = decode, encode, size
        self.named: tuple[str, Version] | None = None if model is None else (model.name, model.version)
        self._decoded: tuple[Model, Any, Any] | None = None

    def size(self, body: Any) -> int:
        return self.bytes

    def target(self, body: Any) -> tuple[str, Version]:
        self._decoded = self.decoder(body)
        return self._decoded[0].name, self._decoded[0].version

    def decode(self, body: Any, model: Model) -> tuple[Any, Any]:
        decoded, self._decoded = self._decoded or self.decoder(body), None
        return decoded[1], decoded[2]

    def encode(self, model: Model, wire: Any, result: Any) -> Any:
        return self.encoder(wire, result)
