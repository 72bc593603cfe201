"""The gRPC answers that describe models and the server, built from what HTTP reports too.

Metadata from `Model.metadata`, statistics from the Worker's `Statistics.report` (the same
numbers GET /v2/models/stats returns), and Triton's model configuration from the model's
TensorSpecs: nothing here is computed twice for the two transports.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from app import __version__
from app.core.model import Model
from app.core.versionstate import IndexRow, State
from app.server.api.v2 import config

# Triton's extensions this transport implements (binary_tensor_data is HTTP's: gRPC tensors are raw anyway).
EXTENSIONS = ("parameters", "statistics", "model_configuration", "model_repository", "trace", "logging")


def server_metadata() -> Any:
    return pb.ServerMetadataResponse(name="normserve", version=__version__, extensions=EXTENSIONS)


def model_metadata(meta: dict[str, Any]) -> Any:
    response = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"])
    for entry, tensors in ((response.inputs, meta["inputs"]), (response.outputs, meta["outputs"])):
        for t in tensors:
            entry.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
    return response


def model_config(model: Model) -> Any:
    return pb.ModelConfigResponse(config=config.model_config(model))


def statistics(report: dict[str, Any]) -> Any:
    """Statistics.report's {"model_stats": [...]}: its keys are the protobuf's field names."""
    return json_format.ParseDict(report, pb.ModelStatisticsResponse())


def repository_index(rows: list[IndexRow], ready_only: bool) -> Any:
    """Runtime.index's rows: every version in the repository folder with its state and reason."""
    response = pb.RepositoryIndexResponse()
    for row in rows:
        if not ready_only or row.state is State.READY:
            response.models.add(name=row.name, version=str(row.version), state=row.state.value, reason=row.reason)
    return response
