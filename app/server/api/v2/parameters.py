"""An infer request's parameters, as both V2 transports send them: the names a model reads, checked for
misspellings; the protocol's own names; numbers sent as strings; and the names that changed nothing, echoed.

app/server/api/v2/rules.py's `decode` reads them first, before any tensor.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from typing import Any

from app.core.model import Model
from app.errors import InvalidInput, shown

MISSPELT_RATIO = 0.6  # difflib's: "epsilon" vs "eps" is 0.6, "eps_mod" vs "eps_mode" 0.93, "content_type" vs "eps" 0.13
# Parameters of the protocol itself (tritonclient's reserved names): accepted, and only the first is used.
PROTOCOL_PARAMETERS = ("binary_data_output", "sequence_id", "sequence_start", "sequence_end", "priority", "timeout")
# A number as a string (KServe's and MLServer's gRPC parameters have no double): a decimal, as JSON writes one,
# in ASCII digits: float() and int() also read Arabic-Indic and fullwidth digits, which a proxy checking numbers
# would refuse.
NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
INTEGER = re.compile(r"[+-]?[0-9]{1,18}")
# Bounds on what a request's parameters may cost: 100,000 unknown names took 5.4 s of difflib and were echoed
# back as 4.1 MB. A model reads at most 3 and the protocol names 6; clients add a few of their own.
MAX_PARAMETERS = 64  # more is a 400 naming `parameters`
MAX_CHECKED_NAME = 64  # longer names are never close to a model's (difflib's cost grows with the length)
MAX_ECHOED = 16  # names listed back in `ignored_parameters`, each cut to MAX_CHECKED_NAME characters


def checked(raw: Any, model: Model) -> dict[str, Any]:
    """The request's parameters. Names the model does not read are accepted and ignored, as Triton's backends
    ignore what they do not know (clients add their own: KServe's codecs, Triton's forwarding), and listed
    back by `ignored`; but a name close to one the model reads (`epsilon`, `Eps`) is refused: a misspelt
    eps must never silently leave the default in place."""
    params = {} if raw is None else raw
    if not isinstance(params, dict):
        raise InvalidInput(f"expected an object, got {shown(params)}", "parameters")
    if len(params) > MAX_PARAMETERS:
        raise InvalidInput(f"{len(params)} parameters; at most {MAX_PARAMETERS} are accepted", "parameters")
    for name, value in params.items():
        if name not in model.parameters and name not in PROTOCOL_PARAMETERS:
            _not_misspelt(name, model)
        if name == "binary_data_output" and not isinstance(value, bool):
            raise InvalidInput(f"expected true or false, got {shown(value)}", "parameters.binary_data_output")
        # Accepted and unused, but still the protocol's parameter values (the model's own are checked as they are read).
        if name in PROTOCOL_PARAMETERS and not isinstance(value, bool | int | float | str):
            raise InvalidInput(f"expected a boolean, number or string, got {shown(value)}", f"parameters.{name}")
    return {name: _number(value, model.numbers.get(name)) for name, value in params.items()}


def _number(value: Any, kind: type[int] | type[float] | None) -> Any:
    """A string that spells a number, read as one where the model's parameter is a number ("eps": "0.001"):
    KServe's and MLServer's gRPC messages cannot send a double. Anything else stays as sent, for the model's
    own check to name (parameters.eps: expected a finite number > 0, got 'abc')."""
    if kind is None or not isinstance(value, str):
        return value
    if kind is int:
        return int(value) if INTEGER.fullmatch(value) else value
    number = float(value) if NUMBER.fullmatch(value) else math.nan
    return number if math.isfinite(number) else value  # "1e999" stays a string, named as sent


def ignored(params: Mapping[str, Any], model: Model) -> tuple[str, ...]:
    """The request parameters that changed nothing: answered back, so that a client can see they were unused;
    the first MAX_ECHOED names in order, each cut, then how many more there were."""
    names = sorted(n for n in params if n not in model.parameters and n not in PROTOCOL_PARAMETERS)
    echoed = [n if len(n) <= MAX_CHECKED_NAME else n[: MAX_CHECKED_NAME - 1] + "…" for n in names[:MAX_ECHOED]]
    more = [f"+{len(names) - MAX_ECHOED} more"] if len(names) > MAX_ECHOED else []
    return (*echoed, *more)


def _not_misspelt(name: str, model: Model) -> None:
    if len(name) > MAX_CHECKED_NAME:
        return
    squashed = name.lower().replace("-", "_")
    ratios = {known: difflib.SequenceMatcher(None, squashed, known).ratio() for known in model.parameters}
    for known in sorted(ratios, key=ratios.__getitem__, reverse=True):  # the closest name is the one suggested
        close = ratios[known] >= MISSPELT_RATIO
        if squashed == known or close or (len(squashed) > 2 and known.startswith(squashed)):
            raise InvalidInput(
                f"unknown parameter for model {model.name!r}; did you mean {known!r}? "
                f"(it reads {', '.join(model.parameters)}; other names are ignored)",
                f"parameters.{name}",
            )
