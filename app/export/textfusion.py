"""The text encoder's graph fused by onnxruntime's transformer optimizer: Attention, SkipLayerNormalization,
EmbedLayerNormalization and BiasGelu, with every output of the plain graph kept under its name.

Two things in the plain graph stop the optimizer, and both are worked around here rather than in the model:
- its symbolic shape inference fails on the pooling head (the normalization's Div, past the ReduceL2), and without
  shapes no SkipLayerNormalization is fused; so the head (everything between `last_hidden_state` and
  `sentence_embedding`) is cut off, the body optimized alone, and the head put back unchanged;
- its attention fusion matches the additive mask only in the forms transformers 4 wrote; textgraph.py builds the
  mask in one of them.
The statistics of the layers' LayerNorms are then read from their SkipLayerNormalization's own optional mean and
inverse std outputs (onnxruntime's CPU kernel computes both anyway), instead of a branch of five ops over the
residual sum, which the kernel had to write out for it: the fused graph's session runs 8% faster on
all-MiniLM-L6-v2 (26.1 against 24.2 sentences/s, medians of 3 interleaved rounds), the std within 1.4e-5 of the
PyTorch model's (its values up to 11). The embeddings' LayerNorm keeps its branch on EmbedLayerNormalization's
sum output (that kernel gives no statistics).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnx

from app.core.textreference import TextConfig
from app.export import graph

HEAD_OUTPUT = "sentence_embedding"
CONTRIB = "com.microsoft"  # the domain of onnxruntime's fused operators
# What the optimizer counts and normserve records: the fusions a BERT-family encoder can get on a CPU.
FUSIONS = ("EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu", "LayerNormalization")
STATISTICS = "statistics from SkipLayerNormalization"  # the LayerNorms whose mean and std the fused kernel gives


def fuse(proto: onnx.ModelProto, config: TextConfig) -> tuple[onnx.ModelProto, dict[str, int]]:
    """The graph with the optimizer's fusions, outputs unchanged in names and order; the count of each fusion."""
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    body, head = _split(proto)
    # opt_level 0: the Python fusions alone; the session's own ORT_ENABLE_ALL optimizations still run at load.
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    fused = optimizer.optimize_model(
        body,
        model_type="bert",
        num_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
        optimization_options=FusionOptions("bert"),
        opt_level=0,
    )
    stats: dict[str, Any] = fused.get_fused_operator_statistics()
    merged = _merged(proto, fused.model, head)
    counts = {op: int(stats.get(op, 0)) for op in FUSIONS}
    counts[STATISTICS] = _statistics_from_skip_layer_norms(merged, config.layer_norm_eps)
    return graph.checked(merged), counts


def _split(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, list[onnx.NodeProto]]:
    """The graph without the pooling head (its other outputs only, nodes they do not need dropped); the head's
    nodes, in graph order."""
    body = onnx.ModelProto()
    body.CopyFrom(proto)
    outputs = [o for o in body.graph.output if o.name != HEAD_OUTPUT]
    del body.graph.output[:]
    body.graph.output.extend(outputs)
    nodes = list(body.graph.node)
    needed = _needed(nodes, {o.name for o in outputs})
    kept = [n for i, n in enumerate(nodes) if i in needed]
    del body.graph.node[:]
    body.graph.node.extend(kept)
    used = {name for n in kept for name in n.input}
    initializers = [t for t in body.graph.initializer if t.name in used]
    del body.graph.initializer[:]
    body.graph.initializer.extend(initializers)
    body_values = {o.name for o in outputs} | {i.name for i in proto.graph.input}
    nodes = list(proto.graph.node)
    head = _needed(nodes, {HEAD_OUTPUT}, stop=body_values)
    return body, [n for i, n in enumerate(nodes) if i in head]


def _needed(nodes: list[onnx.NodeProto], wanted: set[str], stop: frozenset[str] | set[str] = frozenset()) -> set[int]:
    """The indices of the nodes the values `wanted` are computed from, not looking past the values in `stop`."""
    want, indices = set(wanted), set()
    for i in reversed(range(len(nodes))):  # ONNX nodes are in topological order
        if any(o in want and o not in stop for o in nodes[i].output):
            indices.add(i)
            want.update(name for name in nodes[i].input if name)
    return indices


def _merged(plain: onnx.ModelProto, body: onnx.ModelProto, head: list[onnx.NodeProto]) -> onnx.ModelProto:
    """The fused body with the plain graph's head appended (and the initializers it reads), and the plain graph's
    outputs, in its order."""
    merged = onnx.ModelProto()
    merged.CopyFrom(body)
    produced = {o for n in merged.graph.node for o in n.output} | {t.name for t in merged.graph.initializer}
    clash = sorted({o for n in head for o in n.output} & produced)
    if clash:  # the optimizer names its nodes afresh; a clash would mean two producers of one value
        raise graph.ExportError(f"the fused graph already produces {clash}, which the pooling head computes")
    merged.graph.node.extend(head)
    if not any(o.domain == CONTRIB for o in merged.opset_import):  # OnnxModel adds it only when saving to a file
        merged.opset_import.append(onnx.helper.make_opsetid(CONTRIB, 1))
    reads = {name for n in head for name in n.input}
    merged.graph.initializer.extend(t for t in plain.graph.initializer if t.name in reads and t.name not in produced)
    del merged.graph.output[:]
    merged.graph.output.extend(plain.graph.output)
    return merged


def _statistics_nodes(name: str, mean: str, inverse: str, axes: str, epsilon: str) -> list[onnx.NodeProto]:
    """`{name}.mean` and `{name}.std` (B,T) from a SkipLayerNormalization's mean and inverse std outputs (B,T,1)."""
    make = onnx.helper.make_node
    return [
        make("Squeeze", [mean, axes], [f"{name}.mean"]),
        make("Mul", [inverse, inverse], [f"{name}/fused/inv_var"]),
        make("Reciprocal", [f"{name}/fused/inv_var"], [f"{name}/fused/var_eps"]),
        make("Sub", [f"{name}/fused/var_eps", epsilon], [f"{name}/fused/var"]),
        make("Relu", [f"{name}/fused/var"], [f"{name}/fused/var0"]),  # rounding can take a constant row below 0
        make("Sqrt", [f"{name}/fused/var0"], [f"{name}/fused/std"]),
        make("Squeeze", [f"{name}/fused/std", axes], [f"{name}.std"]),
    ]


def _statistics_from_skip_layer_norms(proto: onnx.ModelProto, eps: float) -> int:
    """Each `{name}.mean` and `{name}.std` computed by a branch on a SkipLayerNormalization's sum output rewired to
    that node's mean and inverse std outputs (B,T,1): mean squeezed, std = sqrt(max(1 / inv^2 - eps, 0)), as the
    std is the input's own, without eps. The branches and sum outputs nobody reads any more are dropped; returns the
    number of LayerNorms rewired."""
    producers = {o: n for n in proto.graph.node for o in n.output}
    replaced, added = set(), []
    for value in proto.graph.output:
        if not value.name.endswith(".mean"):
            continue
        name = value.name.removesuffix(".mean")
        reduce = producers[value.name]
        skip = producers.get(reduce.input[0]) if reduce.op_type == "ReduceMean" else None
        if skip is None or skip.op_type != "SkipLayerNormalization" or skip.output[3:4] != [reduce.input[0]]:
            continue
        mean, inverse, axes, epsilon = (f"{name}/fused/{v}" for v in ("mean", "inv_std", "axes", "eps"))
        skip.output[1], skip.output[2] = mean, inverse
        proto.graph.initializer.extend(
            [
                onnx.numpy_helper.from_array(np.array([-1], dtype=np.int64), axes),
                onnx.numpy_helper.from_array(np.array(eps, dtype=np.float32), epsilon),
            ]
        )
        added += _statistics_nodes(name, mean, inverse, axes, epsilon)
        replaced |= {value.name, f"{name}.std"}
    nodes = [n for n in proto.graph.node if not set(n.output) & replaced] + added
    needed = _needed(nodes, {o.name for o in proto.graph.output})
    kept = [n for i, n in enumerate(nodes) if i in needed]
    read = {name for n in kept for name in n.input}
    for node in kept:
        if node.op_type == "SkipLayerNormalization" and node.output[3:4] and node.output[3] not in read:
            node.output[3] = ""  # the sum was written out only for the statistics' branch
    del proto.graph.node[:]
    proto.graph.node.extend(kept)
    return len(replaced) // 2
