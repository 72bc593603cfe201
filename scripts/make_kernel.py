"""Write app/core/layernorm_kernel.onnx (onnxruntime's fused LayerNormalization and each output row's range) and
the two FP16 casts of app/core/halfprecision.py.

The serving install has no `onnx`, so the graph is committed and this script (the `export` extra) makes it;
tests/core/test_kernels.py regenerates it and compares the bytes. Its epsilon attribute is a template:
app/core/kernels.py replaces those four bytes with each request's eps (as float32) before building a session.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file, the repository root is not on sys.path

from app.core.halfprecision import CAST_FILES
from app.core.kernels import KERNEL_FILE, KERNEL_INPUTS, KERNEL_OUTPUTS, OPSET, TEMPLATE_EPS


def kernel_graph() -> onnx.ModelProto:
    """output, mean, inv_std_dev = LayerNormalization(input, gamma, beta); out_max, out_min per row of output."""
    types = {"input": ["rows", "cols"], "gamma": ["cols"], "beta": ["cols"], "output": ["rows", "cols"]}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, types[n]) for n in KERNEL_INPUTS]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, types.get(n, ["rows", 1])) for n in KERNEL_OUTPUTS]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node(
            "LayerNormalization", list(KERNEL_INPUTS), list(KERNEL_OUTPUTS[:3]), axis=-1, epsilon=TEMPLATE_EPS
        ),
        helper.make_node("ReduceMax", ["output", "axes"], ["out_max"], keepdims=1),
        helper.make_node("ReduceMin", ["output", "axes"], ["out_min"], keepdims=1),
    ]
    graph = helper.make_graph(nodes, "layernorm_kernel", inputs, outputs, initializer=[axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="normserve")
    model.ir_version = 9  # onnxruntime >= 1.18 (the serving floor) reads IR 9
    onnx.checker.check_model(model, full_check=True)
    return model


def cast_graph(direction: str) -> onnx.ModelProto:
    """y = Cast(x), both flat: FP16 to float32 ("widen") or float32 to FP16 ("narrow")."""
    half, wide = TensorProto.FLOAT16, TensorProto.FLOAT
    source, target = (half, wide) if direction == "widen" else (wide, half)
    inputs = [helper.make_tensor_value_info("x", source, ["n"])]
    outputs = [helper.make_tensor_value_info("y", target, ["n"])]
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=target)], f"{direction}_fp16", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="normserve")
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> int:
    KERNEL_FILE.write_bytes(kernel_graph().SerializeToString())
    print(f"wrote {KERNEL_FILE}")
    for direction, path in CAST_FILES.items():
        path.write_bytes(cast_graph(direction).SerializeToString())
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
