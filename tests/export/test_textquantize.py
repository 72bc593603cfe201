"""app/export/textquantize.py: `export text-encoder --quantize int8` on a tiny random BERT, checked against the FP32
export of the same folder; refused by its whole message with nothing written when a text loses its cosine."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from app.core.runtime import Runtime
from app.core.textencoder import TextEncoderModel
from app.export import baselines, textparity, textquantize
from app.export.builds import ParityError
from app.export.options import parse_args
from app.export.textexport import export_text_encoder
from app.export.textsource import Head
from app.settings import Settings
from tests.textmodels import TinyModel, tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return tiny_model(tmp_path_factory.mktemp("hf") / "bert", "bert", seed=3)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, tiny: TinyModel) -> Path:
    root = tmp_path_factory.mktemp("models")
    export_text_encoder(root, "fp32", tiny.path)
    export_text_encoder(root, "int8", tiny.path, quantize="int8")
    return root


def served(root: Path, name: str) -> TextEncoderModel:
    runtime = Runtime(Settings(model_dir=root))
    runtime.load()  # each version warmed up: the INT8 one against the reference by cosine
    model = runtime.get(name)
    assert isinstance(model, TextEncoderModel)
    return model


def test_the_manifest_records_the_quantization_and_its_figures(repository: Path) -> None:
    import json

    manifest = json.loads((repository / "int8" / "1" / "manifest.json").read_text())
    q = manifest["quantization"]
    assert (q["type"], q["method"], q["cosine_min"]) == ("int8", "onnxruntime.quantization.quantize_dynamic", 0.99)
    assert q["worst_cosine_vs_fp32"] >= 0.99 and q["texts"] == 13
    assert q["int8_model_bytes"] == (repository / "int8" / "1" / "model.onnx").stat().st_size
    assert q["fp32_model_bytes"] == (repository / "fp32" / "1" / "model.onnx").stat().st_size
    assert "quantization" not in json.loads((repository / "fp32" / "1" / "manifest.json").read_text())


def test_the_int8_graph_quantizes_the_weights_matmuls_alone(repository: Path) -> None:
    ops = {n.op_type for n in onnx.load(str(repository / "int8" / "1" / "model.onnx")).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    assert "MatMul" in ops  # attention's activation products and the feed-forward down projections stay float32


def test_the_served_int8_model_keeps_the_fp32_models_cosine_on_the_check_texts(repository: Path) -> None:
    texts = textparity.texts(served(repository, "fp32").config.max_seq_length, None)
    fp32, int8 = served(repository, "fp32"), served(repository, "int8")
    want = fp32.infer(fp32.tokenize(texts)).sentence_embedding
    got = int8.infer(int8.tokenize(texts)).sentence_embedding
    assert textquantize.cosines(got, want).min() >= textquantize.COSINE_MIN
    assert not np.array_equal(got, want)  # it is another graph


def test_a_text_below_the_cosine_bound_refuses_the_export_and_writes_nothing(
    tiny: TinyModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(textquantize, "COSINE_MIN", 1.5)  # beyond any cosine: every INT8 graph is refused
    pattern = (
        r"^--quantize int8 refused for x: text \d+ keeps cosine 0\.\d{5} with the FP32 model \(at least 1\.5 for "
        r"every check text\); nothing written$"
    )
    with pytest.raises(ParityError, match=pattern):
        export_text_encoder(tmp_path, "x", tiny.path, quantize="int8")
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == []


@pytest.mark.parametrize(("value", "ok"), [("int8", True), ("int4", False), ("fp16", False)])
def test_the_flag_takes_int8_alone(value: str, ok: bool, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["text-encoder", "--name", "x", "--hf", "folder", "--quantize", value]
    if ok:
        assert parse_args(argv).quantize == "int8"
        return
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert re.search(
        rf"argument --quantize: invalid choice: '{value}' \(choose from '?int8'?\)", capsys.readouterr().err
    )


@pytest.mark.parametrize("name", ["fp32", "int8"])
def test_each_versions_baseline_is_its_own_graphs_statistics_on_the_parity_texts(repository: Path, name: str) -> None:
    """The INT8 version's baseline from the INT8 graph it serves, not from the FP32 graph it was checked as."""
    import json

    import onnxruntime as ort

    folder = repository / name / "1"
    manifest = json.loads((folder / "manifest.json").read_text())
    model = served(repository, name)
    tokens, _ = textparity.served_tokens(
        folder,
        textparity.texts(model.config.max_seq_length, None),
        model.config,
        Head("mean", False, model.config.max_seq_length),
    )
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    stats = baselines.text_stats([(textparity.run(session, tokens), tokens.attention_mask)], manifest["layer_norms"])
    want = baselines.manifest_entry(stats, "the parity texts, at real tokens")
    assert manifest["baseline"]["inputs"] == want["inputs"] and set(manifest["baseline"]["layers"]) == set(
        want["layers"]
    )
    for layer, doc in want["layers"].items():
        got = manifest["baseline"]["layers"][layer]
        assert got["count"] == doc["count"]
        assert np.allclose(got["std"], doc["std"], rtol=0, atol=1e-6) and np.allclose(
            got["mean"], doc["mean"], atol=1e-6
        )
