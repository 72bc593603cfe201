"""Triton's model configuration of a served model, built once with Triton's own protobuf (tritonclient ships it).

One builder for both transports: gRPC's ModelConfig answers the message, HTTP's /config its JSON
as Triton writes it (field names as in the .proto, int64 numbers as numbers, not strings).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from app.core.model import FLOAT, PLATFORM, Model, TensorSpec
from app.core.repository import DEFAULT_POLICY

BACKEND = "onnxruntime"
DATATYPES_PARAMETER = "datatypes"  # the config's parameter that lists what FP32 tensors also take
# The config's parameter that names the outputs a half-precision input gets in FP32 (its statistics: model.py).
STATISTICS_PARAMETER = "fp32_outputs_of_half_inputs"
_INT64_FIELDS = ("dims", "versions", "max_queue_delay_microseconds", "preferred_batch_size")


def _data_type(spec: TensorSpec) -> int:
    datatype = spec.datatypes[0]
    value: int = mc.DataType.Value("TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}")  # Triton's name
    return value


def model_config(model: Model) -> Any:
    """Triton's config: no batch dim of Triton's own (max_batch_size 0: -1 dims take any size), optional inputs,
    the version policy of the model's model.json, and dynamic batching where the model batches."""
    config = mc.ModelConfig(name=model.name, platform=PLATFORM, backend=BACKEND, max_batch_size=0)
    for spec in model.inputs:
        config.input.add(name=spec.name, data_type=_data_type(spec), dims=spec.shape, optional=spec.optional)
    for spec in model.outputs:
        config.output.add(name=spec.name, data_type=_data_type(spec), dims=spec.shape)
    # data_type holds one datatype: every TYPE_FP32 tensor also takes (and answers in) the others of FLOAT.
    config.parameters[DATATYPES_PARAMETER].string_value = ",".join(FLOAT)
    statistics = [spec.name for spec in model.outputs if spec.statistic]
    if statistics:  # unless a request asks another datatype for them
        config.parameters[STATISTICS_PARAMETER].string_value = ",".join(statistics)
    json_format.ParseDict({"version_policy": model.version_policy or DEFAULT_POLICY}, config)
    batching = getattr(model, "batching", None)
    if batching and batching["max_batch_size"] > 1:
        delay = batching["max_queue_delay_microseconds"]
        config.dynamic_batching.max_queue_delay_microseconds = delay
        # Requests are merged along their own batch dim: Triton's max_batch_size would add one of its own.
        config.parameters["max_merged_rows"].string_value = str(batching["max_batch_size"])
        config.parameters["max_merged_sequence_length"].string_value = str(batching["max_sequence_length"])
    return config


def to_json(config: Any) -> dict[str, Any]:
    """The config as Triton's HTTP endpoint answers it."""
    doc: dict[str, Any] = _numbers(
        json_format.MessageToDict(config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    )
    return doc


def _numbers(value: Any, key: str = "") -> Any:
    """protobuf's JSON writes int64 as strings; Triton's HTTP answers, and clients expect, numbers."""
    if isinstance(value, dict):
        return {k: _numbers(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v, key) for v in value]
    if key in _INT64_FIELDS and isinstance(value, str):
        return int(value)
    return value
