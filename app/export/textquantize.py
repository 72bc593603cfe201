"""`normserve export text-encoder --quantize int8`: onnxruntime's dynamic INT8 quantization of the checked graph.

Opt-in and checked: the FP32 graph has passed every parity of the export first; its MatMul weights are then
quantized to int8 (activations quantized per call, dynamically), and the INT8 graph replaces model.onnx only if
every check text keeps a cosine of at least COSINE_MIN with the FP32 graph's embedding. Otherwise ParityError,
and the staged version is removed whole (nothing written). The manifest's "quantization" records the figures;
the model kind's warm-up then checks the embeddings' cosine against the float64 reference instead of the FP32
tolerances an INT8 graph cannot keep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from app.core.repository import MODEL_FILE
from app.core.textencoder import TextInput
from app.export.builds import ParityError

QUANTIZE = ("int8",)
COSINE_MIN = 0.99  # per text, INT8 against FP32 (issue 39)
# What was measured on all-MiniLM-L6-v2 (worst cosine with FP32 over the export's check texts): per-tensor weights
# 0.92 (int8) and 0.96 (uint8), per-channel 0.975 and 0.981, per-channel uint8 with the feed-forward down projections
# left in float32 0.990 (their input, the GELU's output, spans the widest range). The attention's
# activation-by-activation MatMuls stay float32 too (quantized as well, per-tensor int8 with reduce_range: 0.77).
# Weights are int8 with reduce_range (7 bits): on x86 onnxruntime multiplies uint8 activations by int8 weights with
# VPMADDUBSW, whose 16-bit pair sums saturate on full-range weights (per-channel int8 without reduce_range: 0.988);
# with 7-bit weights 0.9915, and 1.47x FP32 in process against 1.31x for uint8 weights (one thread, process time,
# medians on benchmarks/embedrows.py's texts; docs/benchmarks.md). Quantizing the down projections too
# reaches 1.77x but keeps 0.975, with SmoothQuant's per-channel scaling (alpha 0.5) 0.977: not enough.
EXTRA_OPTIONS = {"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT}
OPS = ["MatMul"]  # weights only: the embeddings' Gather and the LayerNorm statistics stay float32


def down_projections(model: onnx.ModelProto) -> list[str]:
    """The MatMuls whose constant weight narrows its input (intermediate to hidden): the feed-forward outputs."""
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "MatMul"
        and len(shapes.get(n.input[1], ())) == 2
        and shapes[n.input[1]][0] > shapes[n.input[1]][1]
    ]


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per-row cosine, in float64."""
    a, b = got.astype(np.float64), want.astype(np.float64)
    return np.asarray((a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


def quantize(folder: Path, tokens: TextInput, fp32_embeddings: np.ndarray, name: str) -> dict[str, Any]:
    """folder/model.onnx replaced by its dynamic INT8 quantization, or ParityError (the FP32 file left for the
    staging to remove); the figures for the manifest."""
    fp32, int8 = folder / MODEL_FILE, folder / "model.int8.onnx"
    kept = down_projections(onnx.load(str(fp32)))
    _quantize_dynamic(fp32, int8, kept)
    session = ort.InferenceSession(str(int8), providers=["CPUExecutionProvider"])
    (got,) = session.run(["sentence_embedding"], tokens.feeds())
    per_text = cosines(got, fp32_embeddings)
    worst = float(per_text.min())
    figures: dict[str, Any] = {
        "type": "int8",
        "method": "onnxruntime.quantization.quantize_dynamic",
        "weight_type": "QInt8",
        "per_channel": True,
        "reduce_range": True,
        "op_types": OPS,
        "float32_matmuls": len(kept),
        "worst_cosine_vs_fp32": worst,
        "cosine_min": COSINE_MIN,
        "texts": len(per_text),
        "fp32_model_bytes": fp32.stat().st_size,
        "int8_model_bytes": int8.stat().st_size,
    }
    if not worst >= COSINE_MIN:  # NaN fails too
        int8.unlink()
        raise ParityError(
            f"--quantize int8 refused for {name}: text {int(per_text.argmin())} keeps cosine {worst:.5f} with the "
            f"FP32 model (at least {COSINE_MIN} for every check text); nothing written"
        )
    int8.replace(fp32)
    return figures


def _quantize_dynamic(fp32: Path, int8: Path, kept: list[str]) -> None:
    """onnxruntime's dynamic INT8 quantization of fp32 into int8, the `kept` MatMuls left in float32."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        fp32,
        int8,
        weight_type=QuantType.QInt8,
        per_channel=True,
        reduce_range=True,
        op_types_to_quantize=OPS,
        nodes_to_exclude=kept,
        extra_options=EXTRA_OPTIONS,
    )
