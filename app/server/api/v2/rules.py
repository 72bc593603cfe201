"""The Open Inference Protocol's rules for an infer request, once for both of its transports.

The HTTP codec (app/server/api/v2/http/codec.py) parses JSON and binary sections, the gRPC codec
(app/server/api/v2/grpc/codec.py) reads protobuf messages; both hand plain values to these
functions, which check them and phrase the errors. So a rule (a known input, its datatype, its
rank and element limits, the byte count of raw data, BOOL bytes, the parameters and numbers sent
as strings, the requested outputs, a finite result) lives here alone and reads the same whichever
transport broke it.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.core.dataplane import Fields
from app.core.halfprecision import HALF_DTYPES, narrow
from app.core.model import STATISTICS_OF_HALF, Model, TensorSpec
from app.core.tensors import DATATYPES, check_finite, check_shape, decode_binary
from app.errors import ExtensionNotSupported, InvalidInput, shown
from app.server.api.v2 import strings
from app.settings import Settings

MISSPELT_RATIO = 0.6  # difflib's: "epsilon" vs "eps" is 0.6, "eps_mod" vs "eps_mode" 0.93, "content_type" vs "eps" 0.13
# Tensor parameters that clients add and no model reads: KServe's and MLServer's codecs send content_type.
IGNORED_TENSOR_PARAMETERS = ("content_type",)
# Parameters of the protocol itself (tritonclient's reserved names): accepted, and only the first is used.
PROTOCOL_PARAMETERS = ("binary_data_output", "sequence_id", "sequence_start", "sequence_end", "priority", "timeout")
# A number as a string (KServe's and MLServer's gRPC parameters have no double): a decimal, as JSON writes one,
# in ASCII digits: float() and int() also read Arabic-Indic and fullwidth digits, which a proxy checking numbers
# would refuse.
NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
INTEGER = re.compile(r"[+-]?[0-9]{1,18}")
# Triton's shared-memory extensions, by their HTTP path segment: not supported (errors.ExtensionNotSupported).
SHARED_MEMORY = {"systemsharedmemory": "system_shared_memory", "cudasharedmemory": "cuda_shared_memory"}
# The tensor parameters by which an infer names a registered region (tritonclient's set_shared_memory): of
# either extension, since the region's name does not say which.
SHARED_MEMORY_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
SHARED_MEMORY_EXTENSIONS = " or ".join(SHARED_MEMORY.values())
# Bounds on what a request's parameters may cost: 100,000 unknown names took 5.4 s of difflib and were echoed
# back as 4.1 MB. A model reads at most 3 and the protocol names 6; clients add a few of their own.
MAX_PARAMETERS = 64  # more is a 400 naming `parameters`
MAX_CHECKED_NAME = 64  # longer names are never close to a model's (difflib's cost grows with the length)
MAX_ECHOED = 16  # names listed back in `ignored_parameters`, each cut to MAX_CHECKED_NAME characters
# The data plane's fields as V2 names them: tensors are inputs, the small fields request parameters.
FIELDS = Fields(
    x="inputs.input",
    gamma="inputs.gamma",
    beta="inputs.beta",
    k="parameters.normalized_ndim",
    eps="parameters.eps",
    eps_mode="parameters.eps_mode",
    padding_mask="inputs.padding_mask",
    dtype="outputs.output.parameters.datatype",
)


@dataclass(frozen=True)
class InferRequest:
    id: str | None
    input: Any  # the data plane's input, built by the model's kind (checked)
    datatype: str  # of `input`: every output is sent in it unless `output_datatypes` names another
    outputs: list[tuple[str, bool]]  # the outputs to send, in order, and whether each goes binary (HTTP)
    ignored: tuple[str, ...] = ()  # request parameters no model reads: answered back in the response's parameters
    # outputs[i].parameters.datatype where asked, and the statistics of a half-precision input (output_datatypes)
    output_datatypes: dict[str, str] = field(default_factory=dict)

    def datatype_of(self, name: str) -> str:
        """The datatype an output is sent in: the one asked for it (or a half input's statistic's), else the input's."""
        return self.output_datatypes.get(name, self.datatype)

    @property
    def dtype(self) -> str:
        """The datatype the model computes its `output` in (the data plane's dtype)."""
        return self.datatype_of("output")


def parameters(raw: Any, model: Model) -> dict[str, Any]:
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


def input_spec(name: Any, index: int, model: Model, given: Container[str]) -> TensorSpec:
    """The spec of the request's input number `index`: a string name the model knows, not given before."""
    if not isinstance(name, str):
        raise InvalidInput("expected an object with a string `name`", f"inputs[{index}]")
    specs = {t.name: t for t in model.inputs}
    if name not in specs:
        raise InvalidInput(f"unknown input for model {model.name!r}; expected {', '.join(specs)}", f"inputs.{name}")
    if name in given:
        raise InvalidInput("given twice", f"inputs.{name}")
    return specs[name]


def tensor_header(spec: TensorSpec, datatype: Any, shape: Any, settings: Settings) -> tuple[str, list[int]]:
    """An input's datatype (one its spec accepts) and shape (rank and element limits), checked."""
    field = f"inputs.{spec.name}"
    check_datatype(datatype, spec, field)
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise InvalidInput(f"expected a list of integers, got {shown(shape)}", f"{field}.shape")
    if not 1 <= len(shape) <= settings.max_depth:
        raise InvalidInput(
            f"rank {len(shape)}; expected 1..{settings.max_depth} (NORMSERVE_MAX_DEPTH)", f"{field}.shape"
        )
    check_shape(shape, field, settings.max_elements)
    return datatype, shape


def check_datatype(datatype: Any, spec: TensorSpec, field: str) -> None:
    """A tensor's datatype, sent or asked for an output, is one its spec takes."""
    if datatype not in spec.datatypes:
        *others, last = spec.datatypes
        expected = f"{', '.join(others)} or {last}" if others else last
        raise InvalidInput(f"datatype {shown(datatype)} is not supported; expected {expected}", field)


def from_numbers(arr: np.ndarray, datatype: str, field: str) -> np.ndarray:
    """Numbers sent inline (JSON data, gRPC fp32_contents) for a half-precision tensor, rounded to it as Triton
    reads FP16 JSON; a number beyond its range is refused naming the field, not sent on as inf."""
    return narrow(arr, datatype, field) if datatype in HALF_DTYPES else arr


def tensor_parameters(params: Any, spec: TensorSpec, allowed: tuple[str, ...]) -> dict[str, Any]:
    """An input's own parameters: only the allowed names (HTTP: binary_data_size; gRPC: none)."""
    params = {} if params is None else params  # not `or`: [], 0, "" and false are not objects
    check_shared_memory(params, f"inputs.{spec.name}", ExtensionNotSupported.READS)
    known = (*allowed, *IGNORED_TENSOR_PARAMETERS)
    if not isinstance(params, dict) or any(k not in known for k in params):
        raise InvalidInput(
            f"parameters {shown(params)} are not supported; only {' or '.join(known)} is", f"inputs.{spec.name}"
        )
    for name in IGNORED_TENSOR_PARAMETERS:
        if name in params and not isinstance(params[name], str):
            raise InvalidInput(f"expected a string, got {shown(params[name])}", f"inputs.{spec.name}.parameters.{name}")
    return params


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


def check_shared_memory(params: Any, field: str, why: str) -> None:
    """A tensor naming a shared-memory region is refused as the registration calls are, naming its parameter:
    not as parameters unknown to the model, which would hide that the extension itself is missing."""
    if isinstance(params, dict):
        for name in SHARED_MEMORY_PARAMETERS:
            if name in params:
                raise ExtensionNotSupported(SHARED_MEMORY_EXTENSIONS, f"{field}.parameters.{name}", why)


def check_count(count: int, shape: list[int], field: str) -> None:
    """Elements sent inline (JSON `data`, gRPC typed contents) must fill the shape: only the count must match."""
    if count != math.prod(shape):
        raise InvalidInput(f"{count} elements, but shape {shape} needs {math.prod(shape)}", field)


def requested_outputs(
    entries: Iterable[tuple[Any, Any]], model: Model, binary_default: bool, allowed: tuple[str, ...]
) -> list[tuple[str, bool]]:
    """(name, parameters) of each requested output -> (name, binary) in order; none named: every output."""
    names = [t.name for t in model.outputs]
    chosen: list[tuple[str, bool]] = []
    for i, (name, raw_params) in enumerate(entries):
        if name not in names:
            raise InvalidInput(f"unknown output {shown(name)}; expected one of {', '.join(names)}", f"outputs[{i}]")
        if any(n == name for n, _ in chosen):
            raise InvalidInput("requested twice", f"outputs.{name}")
        params = {} if raw_params is None else raw_params  # not `or`: [], 0, "" and false are not objects
        check_shared_memory(params, f"outputs.{name}", ExtensionNotSupported.WRITES)
        if not isinstance(params, dict) or any(k not in allowed for k in params):
            only = f"; only {' and '.join(allowed)} {'is' if len(allowed) == 1 else 'are'}" if allowed else ""
            raise InvalidInput(f"parameters {shown(params)} are not supported{only}", f"outputs.{name}")
        binary = params.get("binary_data", binary_default)
        if not isinstance(binary, bool):
            raise InvalidInput(f"expected true or false, got {shown(binary)}", f"outputs.{name}.parameters.binary_data")
        chosen.append((name, binary))
    return chosen or [(n, binary_default) for n in names]  # none named: every output, as Triton does


def output_datatypes(entries: Iterable[tuple[Any, Any]], model: Model, datatype: str) -> dict[str, str]:
    """The datatype asked for each output (its parameters.datatype), by name, after `requested_outputs`; with a
    half-precision input, STATISTICS_OF_HALF for the statistics not asked."""
    specs = {t.name: t for t in model.outputs}
    asked = {t.name: STATISTICS_OF_HALF for t in model.outputs if t.statistic} if datatype in HALF_DTYPES else {}
    for name, params in entries:
        wanted = params.get("datatype") if isinstance(params, dict) else None
        if wanted is not None:
            check_datatype(wanted, specs[name], f"outputs.{name}.parameters.datatype")
            asked[name] = wanted
    return asked


def output_tensors(model: Model, req: InferRequest, result: Any) -> Iterable[tuple[str, np.ndarray, bool]]:
    """Each requested output in its datatype, refused if it does not fit it: (name, array, binary)."""
    tensors: Mapping[str, np.ndarray] = model.to_tensors(result)
    for name, binary in req.outputs:
        arr, datatype, where = tensors[name], req.datatype_of(name), f"outputs.{name}"
        if datatype in HALF_DTYPES:  # rounded once (`output` was, by the model), beyond the range refused
            yield name, narrow(arr, datatype, where), binary
            continue
        check_finite(arr, where, datatype)
        # not ascontiguousarray: it makes a scalar [1]
        yield name, np.asarray(arr, dtype=DATATYPES[datatype], order="C"), binary
