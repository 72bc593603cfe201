"""Torch module -> checked ONNX graph on disk: export through torch.export, strip, check, write, reload.

Files are written reproducibly (no source paths in the graph, fixed zip timestamps for weights),
so that the same weights give the same sha256 on every clone.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from app.core.model import Signature
from app.core.repository import MODEL_FILE

_DATATYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "FP32",
    onnx.TensorProto.BOOL: "BOOL",
    onnx.TensorProto.INT64: "INT64",  # a text encoder's token ids
}


class ExportError(RuntimeError):
    """An exported model that is not what the manifest would promise (names, dims, checker)."""


def to_onnx(
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    inputs: Signature,
    outputs: Signature,
    max_dims: dict[str, int],
    opset: int,
) -> onnx.ModelProto:
    """torch.onnx.export through torch.export (dynamo), self-contained, stripped of source paths, checked.

    The named dims of `inputs` become torch.export Dims, one object per name so that axes sharing a name
    are one symbol (and named so in the graph); max_dims bounds some of them.
    """
    axes = {d: torch.export.Dim(d, max=max_dims.get(d)) for _, shape in inputs for d in shape if isinstance(d, str)}
    dynamic_shapes = tuple({i: axes[d] for i, d in enumerate(shape) if isinstance(d, str)} for _, shape in inputs)
    with quiet_torch_export():
        program = torch.onnx.export(
            module,
            example,
            None,
            input_names=[name for name, _ in inputs],
            output_names=[name for name, _ in outputs],
            opset_version=opset,
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            external_data=False,
            optimize=True,
            verbose=False,
        )
    assert program is not None, "torch.onnx.export(dynamo=True) returns an ONNXProgram"
    return checked(program.model_proto)


def checked(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The exported graph stripped of source paths, or ExportError when onnx.checker rejects it."""
    proto = _without_sources(proto)
    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.checker.ValidationError as e:
        raise ExportError(f"onnx.checker rejected the export: {str(e).splitlines()[0]}") from e
    return proto


def _without_sources(proto: onnx.ModelProto) -> onnx.ModelProto:
    for node in proto.graph.node:
        # Each node carries the Python stack trace that made it: absolute paths of this checkout,
        # which would make the file (and its sha256) differ from one clone to the next.
        del node.metadata_props[:]
        node.doc_string = ""
    return proto


@contextlib.contextmanager
def quiet_torch_export() -> Iterator[None]:
    """Silence the exporter's own chatter; the result is verified by the checker and parity instead.

    torch 2.13 warns about its internal pytree API and about axis names shared by several inputs
    (they are kept), and logs that torchvision ops cannot be registered; none concern these models.
    """
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def write_onnx(folder: Path, proto: onnx.ModelProto) -> dict[str, Any]:
    """Write folder/model.onnx; returns the manifest's fields about it: opset, inputs and outputs."""
    (folder / MODEL_FILE).write_bytes(proto.SerializeToString())
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    return {
        "opset": opset,
        "inputs": [_tensor_spec(v) for v in proto.graph.input],
        "outputs": [_tensor_spec(v) for v in proto.graph.output],
    }


def _tensor_spec(value: onnx.ValueInfoProto) -> dict[str, Any]:
    tensor = value.type.tensor_type
    shape = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
    return {"name": value.name, "datatype": _DATATYPES[tensor.elem_type], "shape": shape}


def load_session(path: Path, inputs: Signature, outputs: Signature) -> ort.InferenceSession:
    """Load the written file as the server will, and insist on the exact names and (named) dims."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for expected, got in ((inputs, session.get_inputs()), (outputs, session.get_outputs())):
        if [(v.name, list(v.shape)) for v in got] != expected:
            raise ExportError(f"{path.name}: graph has {[(v.name, v.shape) for v in got]}, expected {expected}")
    return session


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez's format, with fixed zip timestamps so that the same weights give the same sha256."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for key, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(array, dtype=np.float32), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
