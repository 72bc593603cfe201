"""app/export/graph.py: a torch module to a checked, reproducible ONNX file and its manifest fields."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from app.core.model import Signature
from app.export.graph import ExportError, load_session, save_npz, sha256, to_onnx, write_onnx
from tests.live_server import ROOT

INPUTS: Signature = [("x", ["rows", "cols"]), ("bias", ["cols"])]
OUTPUTS: Signature = [("shifted", ["rows", "cols"]), ("total", ["rows", 1])]
OPSET = 18


class ShiftAndSum(nn.Module):
    """A tiny module with two inputs sharing a named dim, and two outputs."""

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2 + bias, x.sum(dim=1, keepdim=True)


def _export() -> onnx.ModelProto:
    example = (torch.zeros(4, 3), torch.zeros(3))  # sizes above 1: torch.export specializes 0 and 1
    return to_onnx(ShiftAndSum().eval(), example, INPUTS, OUTPUTS, {"rows": 1024}, OPSET)


@pytest.fixture(scope="module")
def proto() -> onnx.ModelProto:
    return _export()


@pytest.fixture
def written(tmp_path: Path, proto: onnx.ModelProto) -> Path:
    write_onnx(tmp_path, proto)
    return tmp_path / "model.onnx"


def _dims(values: list[onnx.ValueInfoProto]) -> list[tuple[str, list[str | int]]]:
    return [(v.name, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]) for v in values]


def test_to_onnx_names_inputs_outputs_and_dynamic_dims_as_the_signature(proto: onnx.ModelProto) -> None:
    assert _dims(list(proto.graph.input)) == INPUTS
    assert _dims(list(proto.graph.output)) == OUTPUTS
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [OPSET]


def test_to_onnx_is_checked_and_self_contained(proto: onnx.ModelProto) -> None:
    onnx.checker.check_model(proto, full_check=True)
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)


def test_to_onnx_holds_no_path_of_this_checkout(proto: onnx.ModelProto) -> None:
    data = proto.SerializeToString()
    assert str(ROOT).encode() not in data and b"test_graph.py" not in data  # torch records each node's stack
    assert not any(node.metadata_props or node.doc_string for node in proto.graph.node)


def test_to_onnx_gives_the_same_bytes_every_time(proto: onnx.ModelProto) -> None:
    assert _export().SerializeToString() == proto.SerializeToString()


@pytest.mark.parametrize(("rows", "cols"), [(2, 2), (4, 3), (7, 11)])
def test_the_exported_graph_computes_the_module_at_any_size(written: Path, rows: int, cols: int) -> None:
    session = ort.InferenceSession(str(written), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
    bias = np.arange(cols, dtype=np.float32)
    shifted, total = session.run(None, {"x": x, "bias": bias})
    with torch.no_grad():
        expected = ShiftAndSum()(torch.from_numpy(x), torch.from_numpy(bias))
    np.testing.assert_allclose(shifted, expected[0].numpy(), rtol=1e-6)
    np.testing.assert_allclose(total, expected[1].numpy(), rtol=1e-5, atol=1e-6)


def test_write_onnx_writes_model_onnx_and_returns_its_manifest_fields(tmp_path: Path, proto: onnx.ModelProto) -> None:
    entry = write_onnx(tmp_path, proto)
    assert (tmp_path / "model.onnx").read_bytes() == proto.SerializeToString()
    assert entry == {
        "opset": OPSET,
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [-1, -1]},
            {"name": "bias", "datatype": "FP32", "shape": [-1]},
        ],
        "outputs": [
            {"name": "shifted", "datatype": "FP32", "shape": [-1, -1]},
            {"name": "total", "datatype": "FP32", "shape": [-1, 1]},
        ],
    }


def test_load_session_accepts_the_exact_signature(written: Path) -> None:
    session = load_session(written, INPUTS, OUTPUTS)
    assert [i.name for i in session.get_inputs()] == ["x", "bias"]


@pytest.mark.parametrize(
    ("inputs", "outputs", "which"),
    [
        ([("x", ["rows", "cols"]), ("beta", ["cols"])], OUTPUTS, "inputs"),  # a name
        ([("x", ["rows", "cols"]), ("bias", ["rows"])], OUTPUTS, "inputs"),  # a named dim
        (INPUTS, [("shifted", ["rows", "cols"]), ("total", ["rows", 2])], "outputs"),  # a fixed dim
        (INPUTS, OUTPUTS[:1], "outputs"),  # an output the graph has more
        (INPUTS[::-1], OUTPUTS, "inputs"),  # the order
    ],
    ids=["input-name", "named-dim", "fixed-dim", "missing-output", "input-order"],
)
def test_load_session_refuses_a_graph_with_another_signature(
    written: Path, inputs: Signature, outputs: Signature, which: str
) -> None:
    graph = {
        "inputs": "[('x', ['rows', 'cols']), ('bias', ['cols'])]",
        "outputs": "[('shifted', ['rows', 'cols']), ('total', ['rows', 1])]",
    }[which]
    expected = inputs if which == "inputs" else outputs
    with pytest.raises(ExportError) as e:
        load_session(written, inputs, outputs)
    assert str(e.value) == f"model.onnx: graph has {graph}, expected {expected}"


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"layers.0.weight": rng.standard_normal((3, 4)), "layers.0.bias": np.arange(3, dtype=np.float32)}


def test_save_npz_gives_the_same_sha256_every_time(tmp_path: Path) -> None:
    save_npz(tmp_path / "a.npz", _weights())
    (tmp_path / "b.npz").touch()  # another file, another time: the archive holds no clock
    save_npz(tmp_path / "b.npz", _weights())
    assert sha256(tmp_path / "a.npz") == sha256(tmp_path / "b.npz")
    with zipfile.ZipFile(tmp_path / "a.npz") as archive:
        assert {i.date_time for i in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_save_npz_writes_float32_arrays_that_numpy_loads_without_pickle(tmp_path: Path) -> None:
    weights = _weights()
    save_npz(tmp_path / "w.npz", weights)
    with np.load(tmp_path / "w.npz", allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted(weights)
        for key, value in weights.items():
            assert npz[key].dtype == np.float32
            np.testing.assert_array_equal(npz[key], value.astype(np.float32))


def test_sha256_is_hashlibs(written: Path) -> None:
    assert sha256(written) == hashlib.sha256(written.read_bytes()).hexdigest()
