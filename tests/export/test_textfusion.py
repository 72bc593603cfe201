"""app/export/textfusion.py: `export text-encoder --optimize` on tiny random BERT, RoBERTa, XLM-RoBERTa and DistilBERT
folders: the graph fused by onnxruntime's transformer optimizer answers within the text-encoder issue's bounds of the
user's own model (cosine at least 0.99999 and max abs at most 2e-5 on the embeddings), keeps every output of the
plain graph, and is replaced by the plain graph when it misses parity."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers

from app.core.runtime import Runtime
from app.core.textencoder import TextEncoderModel, signature
from app.core.textreference import TextConfig
from app.export import textexport, textfusion
from app.export.options import parse_args
from app.export.textexport import export_text_encoder
from app.export.textgraph import pool
from app.export.textparity import COSINE_MIN, figures, served_tokens
from app.export.textsource import Head
from app.settings import Settings
from tests.export.test_textexport import TOLERANCE, UNSEEN  # the same bounds and unseen texts as the plain graph's
from tests.textmodels import LAYERS, MODEL_TYPES, TinyModel, tiny_model


@dataclasses.dataclass(frozen=True)
class Case:
    tiny: TinyModel
    manifest: dict[str, Any]
    version: Path


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fused") / "models"


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory, repository: Path) -> dict[str, Case]:
    base, out = tmp_path_factory.mktemp("hf"), {}
    for i, model_type in enumerate(MODEL_TYPES):
        tiny = tiny_model(base / model_type, model_type, seed=10 + i, safetensors=model_type != "distilbert")
        done = export_text_encoder(repository, model_type, tiny.path, optimize=True)
        out[model_type] = Case(tiny, done.manifest, done.folder)
    return out


def _ops(version: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(version / "model.onnx")).graph.node}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_manifest_records_attention_and_skip_layer_norm_fused_in_every_layer(
    cases: dict[str, Case], model_type: str
) -> None:
    case = cases[model_type]
    fusion = case.manifest["fusion"]
    assert (fusion["fused"], fusion["method"]) == (True, "onnxruntime.transformers.optimizer")
    assert fusion["operators"]["Attention"] == LAYERS
    assert fusion["operators"]["SkipLayerNormalization"] == 2 * LAYERS
    assert fusion["operators"][textfusion.STATISTICS] == 2 * LAYERS  # every layer's LayerNorms: read from the kernel
    assert {"Attention", "SkipLayerNormalization"} <= _ops(case.version)
    assert "Softmax" not in _ops(case.version)  # no attention left unfused


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_fused_graph_has_the_plain_graphs_inputs_and_outputs(cases: dict[str, Case], model_type: str) -> None:
    case = cases[model_type]
    session = ort.InferenceSession(str(case.version / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs, outputs = signature(TextConfig.from_manifest(case.manifest))
    assert [(v.name, list(v.shape)) for v in session.get_inputs()] == inputs
    assert [(v.name, list(v.shape)) for v in session.get_outputs()] == outputs


@pytest.mark.parametrize("texts", [UNSEEN, UNSEEN[:1]], ids=["padded-batch", "one-text-no-padding"])
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_fused_graphs_embeddings_stay_within_the_bounds_of_the_users_model(
    cases: dict[str, Case], model_type: str, texts: list[str]
) -> None:
    case = cases[model_type]
    config = TextConfig.from_manifest(case.manifest)
    head = Head("mean", False, config.max_seq_length)
    tokens, _ = served_tokens(case.version, texts, config, head)
    session = ort.InferenceSession(str(case.version / "model.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(["sentence_embedding"], tokens.feeds())
    model = transformers.AutoModel.from_pretrained(str(case.tiny.path), attn_implementation="eager").eval()
    feeds = {k: torch.from_numpy(v) for k, v in tokens.feeds().items()}
    with torch.no_grad():
        want = pool(model(**feeds).last_hidden_state, feeds["attention_mask"], head).numpy()
    worst = figures(got, want)
    assert worst["cosine"] >= COSINE_MIN and worst["max_abs"] <= TOLERANCE, worst


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_served_fused_graphs_hidden_states_and_layer_norm_statistics_keep_the_references_bounds(
    cases: dict[str, Case], repository: Path, model_type: str
) -> None:
    """The server's own check (its warm-up's): each output against the float64 reference within its tolerance."""
    runtime = Runtime(Settings(model_dir=repository))
    runtime.load()
    model = runtime.get(model_type)
    assert isinstance(model, TextEncoderModel)
    for what, (diff, atol) in model.check(UNSEEN, UNSEEN[-1:]).items():
        assert diff <= atol, (what, diff, atol)


def test_a_fused_graph_that_misses_parity_is_replaced_by_the_plain_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = tiny_model(tmp_path / "hf", "bert", seed=20)
    fuse = textfusion.fuse

    def off_by_a_percent(proto: onnx.ModelProto, config: TextConfig) -> tuple[onnx.ModelProto, dict[str, int]]:
        """The real fused graph with its last LayerNorm's gain 1% off: a fusion that changed the answers."""
        fused, counts = fuse(proto, config)
        for tensor in fused.graph.initializer:
            if tensor.name.endswith(f"layer.{LAYERS - 1}.output.LayerNorm.weight"):
                gain = onnx.numpy_helper.to_array(tensor) * np.float32(1.01)
                tensor.CopyFrom(onnx.numpy_helper.from_array(gain, tensor.name))
        return fused, counts

    monkeypatch.setattr(textexport.textfusion, "fuse", off_by_a_percent)
    done = export_text_encoder(tmp_path / "models", "x", tiny.path, optimize=True)
    fusion = done.manifest["fusion"]
    assert fusion["fused"] is False and fusion["operators"]["Attention"] == LAYERS
    assert fusion["refused"].startswith("parity failed for x: onnx_vs_torch: worst cosine")
    assert "Attention" not in _ops(done.folder)
    assert done.manifest["parity"]["onnx_vs_torch"]["max_abs"] <= TOLERANCE
    on_disk = json.loads((done.folder / "manifest.json").read_text())
    assert on_disk["fusion"] == fusion


@pytest.mark.parametrize(
    ("flags", "optimize"), [([], False), (["--optimize"], True), (["--no-optimize"], False)], ids=str
)
def test_the_optimize_flag_is_off_unless_given(flags: list[str], optimize: bool) -> None:
    assert parse_args(["text-encoder", "--name", "x", "--hf", "folder", *flags]).optimize is optimize
