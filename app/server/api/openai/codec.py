"""OpenAI's embeddings API (and /tokenize) for text encoders: bodies to the model's tokens, results to JSON.

Pure functions of the body, the settings and the model lookup, as the REST codec's; pydantic checks the small
fields' types, the text encoder (app/core/textencoder.py) each text and token id. Errors are the project's
(app/errors.py), shaped as OpenAI's by `error_body` so that the official client raises its own classes.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.core.model import Model
from app.core.tensors import dumps, loads
from app.core.textbatching import Pooled
from app.core.textencoder import TextEncoderModel, TextInput, TextOutput
from app.errors import InvalidInput, PayloadTooLarge, shown
from app.server.dataplane import INLINE_BODY_BYTES
from app.settings import Settings

MAX_INPUTS = 2048  # OpenAI's own limit on the inputs of one request


class EmbeddingsParams(BaseModel):
    """The fields of POST /v1/embeddings: OpenAI's, and normserve's `truncate` and `return_layer_norms`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(description="A text encoder of the repository.")
    input: Any = Field(description="A string, a list of strings, a list of token ids, or a list of such lists.")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: JSON numbers; base64: the little-endian float32 bytes."
    )
    dimensions: int | None = Field(None, description="The model's width, or a Matryoshka size its manifest declares.")
    user: str | None = Field(None, description="Accepted and ignored, as a caller's identifier.")
    truncate: bool = Field(True, description="false: a text past the model's maximum length is a 400.")
    return_layer_norms: bool = Field(False, description="Also each LayerNorm's per-token input mean and std.")


class TokenizeParams(BaseModel):
    """The fields of POST /tokenize."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(description="A text encoder of the repository.")
    input: Any = Field(description="A string or a list of strings.")


@dataclass(frozen=True)
class Wire:
    """What the answer needs of the request."""

    model: str
    encoding_format: str
    dimensions: int
    layer_norms: bool


def parse(params: type[BaseModel], body: bytes | bytearray) -> Any:
    """The body as params, or a 400 naming the first field that is wrong."""
    doc = loads(body)
    if not isinstance(doc, dict):
        raise InvalidInput(f"{shown(doc)}; expected a JSON object", "body")
    try:
        return params.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        name = ".".join(str(p) for p in err["loc"]) or "body"
        if err["type"] == "missing":
            raise InvalidInput("field required", name) from None
        if err["type"] == "extra_forbidden":
            known = ", ".join(params.model_fields)
            raise InvalidInput(f"unknown field; expected only {known}", name) from None
        raise InvalidInput(f"{err['msg']} (got {shown(err.get('input'))})", name) from None


def text_encoder(model: Model, name: str) -> TextEncoderModel:
    """The model a body names, which must be a text encoder: a 400 naming the kinds if it is another kind."""
    if not isinstance(model, TextEncoderModel):
        raise InvalidInput(f"{name!r} is of kind {model.kind}; this route takes the kind text-encoder", "model")
    return model


def texts_of(value: Any) -> list[str]:
    """`input` of /tokenize: a string or a non-empty list of at most MAX_INPUTS strings (each checked by the
    model)."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise InvalidInput(f"{shown(value)}; expected a string or a non-empty list of strings", "input")
    _at_most(len(texts))
    return texts


def _at_most(count: int) -> None:
    if count > MAX_INPUTS:
        raise InvalidInput(f"{count} inputs; at most {MAX_INPUTS} per request", "input")


def tokens_of(model: TextEncoderModel, value: Any, truncate: bool) -> TextInput:
    """`input` of /v1/embeddings as the model's tokens: texts (a string or strings) or token ids (a list of ints,
    or of lists of ints), each a 400 naming it when it is not what the model takes."""
    if isinstance(value, str):
        return model.tokenize([value], "input", truncate)
    if not isinstance(value, list) or not value:
        raise InvalidInput(
            f"{shown(value)}; expected a string, a non-empty list of strings, or token ids (a list of ints, "
            "or of lists of ints)",
            "input",
        )
    first = value[0]
    if isinstance(first, int) and not isinstance(first, bool):
        return model.from_ids(value, "input", flat=True)  # one text's ids
    _at_most(len(value))
    if isinstance(first, list):
        return model.from_ids(value, "input")
    return model.tokenize(value, "input", truncate)


def check_total(request: TextInput, settings: Settings) -> None:
    total = sum(request.tokens)
    if total > settings.max_request_tokens:
        raise PayloadTooLarge(
            f"{total} tokens; at most {settings.max_request_tokens} per request (NORMSERVE_MAX_REQUEST_TOKENS)",
            "input",
        )


def dimensions_of(model: TextEncoderModel, dimensions: int | None) -> int:
    """The width asked, which must be the model's: the exporter declares no Matryoshka sizes, so a shorter prefix
    of an embedding is nothing the model was trained to give."""
    width = model.config.hidden_size
    if dimensions is None or dimensions == width:
        return width
    raise InvalidInput(
        f"{dimensions}; model {model.name!r} gives {width} dimensions and declares no Matryoshka sizes", "dimensions"
    )


def decode_embeddings(params: EmbeddingsParams, model: Model, settings: Settings) -> tuple[Pooled, Wire]:
    """The model's tokens of `input`, to be pooled with concurrent requests' texts, and what the answer needs."""
    encoder = text_encoder(model, params.model)
    dimensions = dimensions_of(encoder, params.dimensions)
    tokens = tokens_of(encoder, params.input, params.truncate)
    check_total(tokens, settings)
    request = Pooled(
        tokens.input_ids, tokens.attention_mask, tokens.token_type_ids, layer_norms=params.return_layer_norms
    )
    return request, Wire(params.model, params.encoding_format, dimensions, params.return_layer_norms)


def encode_embeddings(wire: Wire, result: TextOutput) -> bytes:
    """OpenAI's list of embeddings, in float or base64 (little-endian float32), with the tokens run as usage."""
    rows = result.sentence_embedding[:, : wire.dimensions].astype("<f4")
    data: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        embedding: Any = base64.b64encode(row.tobytes()).decode() if wire.encoding_format == "base64" else row
        item: dict[str, Any] = {"object": "embedding", "index": i, "embedding": embedding}
        if wire.layer_norms:  # over the text's own tokens: padding positions mean nothing
            n = result.tokens[i]
            item["layer_norms"] = [{"name": k, "mean": m[i, :n], "std": s[i, :n]} for k, m, s in result.layer_norms]
        data.append(item)
    total = sum(result.tokens)
    usage = {"prompt_tokens": total, "total_tokens": total}
    return dumps({"object": "list", "data": data, "model": wire.model, "usage": usage})


def encode_tokens(model: TextEncoderModel, request: TextInput) -> bytes:
    """Each text's ids and tokens as the model runs them (special tokens included, cut at its maximum length)."""
    out = []
    for ids, n in zip(request.input_ids, request.tokens, strict=True):
        own = [int(t) for t in ids[:n]]
        out.append({"ids": own, "tokens": [model.tokenizer.id_to_token(t) for t in own]})
    return dumps({"model": model.name, "data": out, "usage": {"prompt_tokens": sum(request.tokens)}})


def models_list(models: Sequence[Model]) -> bytes:
    """GET /v1/models: the text encoders serving, once per name, in OpenAI's list shape."""
    names = sorted({m.name for m in models if isinstance(m, TextEncoderModel)})
    data = [{"id": n, "object": "model", "created": 0, "owned_by": "normserve"} for n in names]
    return dumps({"object": "list", "data": data})


# OpenAI's error types by status: the client raises its class by status and shows the message.
_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}
_CODES = {413: "request_too_large", 503: "overloaded", 504: "timeout"}


def error_body(message: str, field: str | None, status: int) -> dict[str, Any]:
    """{"error": {"message", "type", "param", "code"}} as OpenAI answers errors."""
    kind = "server_error" if status >= 500 else _TYPES.get(status, "invalid_request_error")
    code = "model_not_found" if status == 404 and field == "model" else _CODES.get(status)
    return {"error": {"message": message, "type": kind, "param": field, "code": code}}


class _BodyNamesTheModel:
    """A request whose JSON body names the model, for DataPlane.infer (app/server/pipeline.py's Codec), run in the
    threadpool whatever its size: tokenizing 2048 texts is no work for the event loop, and a pooled request blocks
    its thread while the pool gathers."""

    named = None
    fields: type[EmbeddingsParams] | type[TokenizeParams]

    def __init__(self) -> None:
        self.params: Any = None

    def size(self, body: bytes | bytearray) -> int:
        return max(len(body), INLINE_BODY_BYTES + 1)

    def target(self, body: bytes | bytearray) -> tuple[str, int | str | None]:
        self.params = parse(self.fields, body)
        return self.params.model, None

    def parsed(self, body: bytes | bytearray) -> Any:
        """The body's fields, parsed once: by target, before the model was found."""
        params, self.params = self.params or parse(self.fields, body), None
        return params


class EmbeddingsCodec(_BodyNamesTheModel):
    """A /v1/embeddings request: the texts pooled with concurrent requests' by the model."""

    fields = EmbeddingsParams

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings

    def decode(self, body: bytes | bytearray, model: Model) -> tuple[Pooled, Wire]:
        return decode_embeddings(self.parsed(body), model, self.settings)

    def encode(self, model: Model, wire: Wire, result: TextOutput) -> bytes:
        return encode_embeddings(wire, result)


class TokenizeCodec(_BodyNamesTheModel):
    """A /tokenize request: its run is the model's tokenizer (the Job's `run`), not the graph; admitted, counted and
    drained as every inference request is."""

    fields = TokenizeParams

    def decode(self, body: bytes | bytearray, model: Model) -> tuple[list[str], None]:
        params: TokenizeParams = self.parsed(body)
        text_encoder(model, params.model)
        return texts_of(params.input), None

    def run(self, model: Model, texts: list[str]) -> TextInput:
        return text_encoder(model, model.name).tokenize(texts, "input")

    def encode(self, model: Model, wire: None, result: TextInput) -> bytes:
        return encode_tokens(text_encoder(model, model.name), result)
