"""The Open Inference Protocol's rules for an infer request, once for both of its transports.

Each transport reads its wire into one plain value (app/server/api/v2/request.py's V2Request: the HTTP
codec from JSON and binary sections, the gRPC codec from protobuf messages), and `decode` checks all of it
in one pass, calling down into the helpers below and app/server/api/v2/elements.py, never back into a codec.
So a rule (the model the body names, a known input, its datatype, its rank and element limits, the byte
count of raw data, BOOL bytes, the parameters and numbers sent as strings, the requested outputs, a finite
result) lives here alone and reads the same whichever transport broke it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.core.dataplane import Fields
from app.core.halfprecision import HALF_DTYPES, narrow
from app.core.jsonkeys import check_unique_keys
from app.core.model import STATISTICS_OF_HALF, Model, TensorSpec
from app.core.tensors import DATATYPES, check_finite, check_shape
from app.errors import ExtensionNotSupported, InvalidInput, MalformedBody, shown
from app.server.api.v2 import elements, parameters
from app.server.api.v2.request import V2Request
from app.settings import Settings

# Tensor parameters that clients add and no model reads: KServe's and MLServer's codecs send content_type.
IGNORED_TENSOR_PARAMETERS = ("content_type",)
# Triton's shared-memory extensions, by their HTTP path segment: not supported (errors.ExtensionNotSupported).
SHARED_MEMORY = {"systemsharedmemory": "system_shared_memory", "cudasharedmemory": "cuda_shared_memory"}
# The tensor parameters by which an infer names a registered region (tritonclient's set_shared_memory): of
# either extension, since the region's name does not say which.
SHARED_MEMORY_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
SHARED_MEMORY_EXTENSIONS = " or ".join(SHARED_MEMORY.values())
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


def decode(request: V2Request, model: Model, settings: Settings) -> InferRequest:
    """Every rule of an infer request in one pass, in the order a client's mistakes are named: the model the
    body names, the parameters, each input, the outputs, then the JSON header's keys; last, the model's kind
    builds (and checks) the data plane's input."""
    _same_model(request, model)
    params = parameters.checked(request.parameters, model)
    tensors, datatype = _inputs(request, model, settings)
    if request.outputs is None:
        raise InvalidInput("expected a list of {name, parameters}", "outputs")
    # HTTP answers each output as binary data or JSON, as asked; gRPC always raw, and refuses binary_data.
    binary_default = request.binary_outputs and params.get("binary_data_output", False)
    allowed = ("binary_data", "datatype") if request.binary_outputs else ("datatype",)
    outputs = requested_outputs(request.outputs, model, binary_default, allowed)
    asked = output_datatypes(request.outputs, model, datatype)
    if request.json is not None:  # last: then its tensors are known to be numbers, and the scan one cheap pass
        check_unique_keys(request.json.body, request.json.end)
    req = InferRequest(request.id, None, datatype, outputs, parameters.ignored(params, model), asked)
    return dataclasses.replace(req, input=model.from_tensors(tensors, params, FIELDS, req.dtype))


def _same_model(request: V2Request, model: Model) -> None:
    """A body's model_name / model_version must name the model the URL chose (an empty version: any)."""
    name, version = request.model_name, request.model_version
    if name is not None and name != model.name:
        raise InvalidInput(f"{shown(name)} is not the model of the URL, {model.name!r}", "model_name")
    if version not in (None, "") and str(version) != model.version:
        raise InvalidInput(
            f"{shown(version)} is not the version that serves this request, {model.version}", "model_version"
        )


def _inputs(request: V2Request, model: Model, settings: Settings) -> tuple[dict[str, np.ndarray], str]:
    """The checked tensors by name, and the datatype of `input` (a text encoder's inputs are tokens or text, and
    its outputs float32)."""
    inputs, raw, binary = request.inputs, request.raw, request.binary
    if not inputs:
        raise InvalidInput("expected a non-empty list of input tensors", "inputs")
    if raw and len(raw) != len(inputs):
        raise InvalidInput(
            f"{len(raw)} for {len(inputs)} inputs; expected one per input, in order, or none", elements.RAW
        )
    bools = request.json is None or request.json.may_hold_bools
    tensors: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    offset = 0
    for i, entry in enumerate(inputs):
        spec = input_spec(entry.name, i, model, tensors)
        header = tensor_header(spec, entry.datatype, entry.shape, settings)
        # gRPC: KServe's client names each raw input's size: accepted, as the raw bytes' own length is what counts.
        params = tensor_parameters(entry.parameters, spec, ("binary_data_size",))
        # Where the elements are is the transport's: gRPC's raw_input_contents or typed contents (raw[i] copies
        # the bytes out of the message once; the array is a view of that copy), HTTP's JSON or binary part.
        if binary is None:
            tensors[spec.name] = elements.of_message(entry.data, raw[i] if raw else None, spec, header)
        else:
            rest = binary[offset:]
            tensors[spec.name], size = elements.of_body(entry.data, params, rest, spec, header, settings, bools)
            offset += size
        datatypes[spec.name] = header[0]
    if binary is not None and offset != len(binary):
        raise MalformedBody(
            f"the inputs' binary_data_size add up to {offset} bytes, but {len(binary)} follow the JSON header",
            "binary_data_size",
        )
    model.check_tensors(tensors, FIELDS)
    return tensors, datatypes.get("input", "FP32")


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


def check_shared_memory(params: Any, field: str, why: str) -> None:
    """A tensor naming a shared-memory region is refused as the registration calls are, naming its parameter:
    not as parameters unknown to the model, which would hide that the extension itself is missing."""
    if isinstance(params, dict):
        for name in SHARED_MEMORY_PARAMETERS:
            if name in params:
                raise ExtensionNotSupported(SHARED_MEMORY_EXTENSIONS, f"{field}.parameters.{name}", why)


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
