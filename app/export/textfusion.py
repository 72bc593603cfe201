"""The text encoder's graph fused by onnxruntime's transformer optimizer: Attention, SkipLayerNormalization,
EmbedLayerNormalization and BiasGelu, with every output of the plain graph kept under its name.

Two things in the plain graph stop the optimizer, and both are worked around here rather than in the model:
- its symbolic shape inference fails on the pooling head (the normalization's Div, past the ReduceL2), and without
  shapes no SkipLayerNormalization is fused; so the head (everything between `last_hidden_state` and
  `sentence_embedding`) is cut off, the body optimized alone, and the head put back unchanged;
- its attention fusion matches the additive mask only in the forms transformers 4 wrote; textgraph.py builds the
  mask in one of them.
The LayerNorm statistics read the residual sums, which the fused SkipLayerNormalization and EmbedLayerNormalization
still give (their optional sum outputs), so the statistics' outputs are untouched.
"""

from __future__ import annotations

import logging
from typing import Any

import onnx

from app.core.textreference import TextConfig
from app.export import graph

HEAD_OUTPUT = "sentence_embedding"
CONTRIB = "com.microsoft"  # the domain of onnxruntime's fused operators
# What the optimizer counts and normserve records: the fusions a BERT-family encoder can get on a CPU.
FUSIONS = ("EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu", "LayerNormalization")


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
    return graph.checked(merged), {op: int(stats.get(op, 0)) for op in FUSIONS}


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
