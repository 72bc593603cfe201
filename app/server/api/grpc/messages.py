"""The gRPC answers that describe models and the server, built from what HTTP reports too.

Metadata from `Model.metadata`, statistics from the Worker's `Statistics.report` (the same
numbers GET /v2/models/stats returns), and Triton's model configuration from the model's
TensorSpecs: nothing here is computed twice for the two transports.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from app import __version__
from app.core.model import PLATFORM, Model, TensorSpec
from app.server.admission import Admission

BACKEND = "onnxruntime"
# Triton's extensions this transport implements (binary_tensor_data is HTTP's: gRPC tensors are raw anyway).
EXTENSIONS = ("parameters", "statistics", "model_configuration", "trace", "logging")
READY, UNAVAILABLE = "READY", "UNAVAILABLE"  # Triton's model states


def server_metadata() -> Any:
    return pb.ServerMetadataResponse(name="normserve", version=__version__, extensions=EXTENSIONS)


def model_metadata(model: Model) -> Any:
    meta = model.metadata
    response = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"])
    for entry, tensors in ((response.inputs, meta["inputs"]), (response.outputs, meta["outputs"])):
        for t in tensors:
            entry.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
    return response


def _data_type(spec: TensorSpec) -> int:
    value: int = mc.DataType.Value(f"TYPE_{spec.datatypes[0]}")
    return value


def model_config(model: Model) -> Any:
    """Triton's config: no batch dim of Triton's own (max_batch_size 0: -1 dims take any size), optional inputs."""
    config = mc.ModelConfig(name=model.name, platform=PLATFORM, backend=BACKEND, max_batch_size=0)
    for spec in model.inputs:
        config.input.add(name=spec.name, data_type=_data_type(spec), dims=spec.shape, optional=spec.optional)
    for spec in model.outputs:
        config.output.add(name=spec.name, data_type=_data_type(spec), dims=spec.shape)
    return pb.ModelConfigResponse(config=config)


def statistics(report: dict[str, Any]) -> Any:
    """Statistics.report's {"model_stats": [...]}: its keys are the protobuf's field names."""
    return json_format.ParseDict(report, pb.ModelStatisticsResponse())


def repository_index(models: list[Model], admission: Admission, ready_only: bool) -> Any:
    """Every loaded model: READY once the worker is (verified and warmed up), else UNAVAILABLE with the reason."""
    state, reason = (READY, "") if admission.ready else (UNAVAILABLE, admission.not_ready_reason)
    response = pb.RepositoryIndexResponse()
    if ready_only and state != READY:
        return response
    for model in models:
        response.models.add(name=model.name, version=model.version, state=state, reason=reason)
    return response
