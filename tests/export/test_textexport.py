"""app/export/textexport.py: tiny random BERT, RoBERTa, XLM-RoBERTa and DistilBERT folders exported as text encoders.

Each folder is made in the test with transformers (tests/textmodels.py), its tokenizer trained there. The written
version is then checked on texts the export never saw: the graph run with onnxruntime on the model's own
tokenizer's ids, against the HF model in PyTorch with the folder's pooling, and against the float64 NumPy reference
on the weights.npz written beside it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers

from app.core import monitor, textreference
from app.core.textencoder import TextInput
from app.core.textreference import TextConfig
from app.export.exporter import main
from app.export.textexport import export_text_encoder
from app.export.textparity import COSINE_MIN, REFERENCE_ATOL, TokenizerMismatch, check_tokens, served_tokens, texts
from app.export.textsource import Head
from tests.textmodels import MODEL_TYPES, TinyModel, sentence_transformers_folder, tiny_model

TOLERANCE = 2e-5  # the embeddings against the user's model (API.md section 12)
UNSEEN = [  # none of these is among the built-in parity texts
    "Résumés of naïve coöperation, déjà vu.",
    "数据在这里。",
    "Two short words",
    "An unusually long sentence that keeps going on and on " * 6,
]
ST_MAX_LEN = 20  # the sentence-transformers folder's own maximum length, below the positions'


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    tiny: TinyModel
    folder: Path  # what was exported: the HF folder, or a sentence-transformers folder made from it
    head: Head  # what the folder says
    manifest: dict[str, Any]
    version: Path


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    base = tmp_path_factory.mktemp("text")
    root, out = base / "models", {}
    for i, model_type in enumerate(MODEL_TYPES):
        tiny = tiny_model(base / model_type, model_type, seed=i, safetensors=model_type != "distilbert")
        done = export_text_encoder(root, model_type, tiny.path)
        out[model_type] = Case(
            model_type, tiny, tiny.path, Head("mean", False, tiny.max_positions), done.manifest, done.folder
        )
    tiny = out["roberta"].tiny
    st = sentence_transformers_folder(tiny, base / "roberta-st", "cls", True, ST_MAX_LEN)
    done = export_text_encoder(root, "roberta-st", st)
    out["roberta-st"] = Case("roberta-st", tiny, st, Head("cls", True, ST_MAX_LEN), done.manifest, done.folder)
    return out


CASES = [*MODEL_TYPES, "roberta-st"]


@pytest.mark.parametrize("case_id", CASES)
def test_the_manifest_describes_the_architecture_the_head_and_the_graph(cases: dict[str, Case], case_id: str) -> None:
    case = cases[case_id]
    m, model_type = case.manifest, case.tiny.model_type
    assert (m["kind"], m["name"], m["version"]) == ("text-encoder", case_id, 1)
    assert (m["pooling"], m["normalize"], m["max_seq_length"]) == (
        case.head.pooling,
        case.head.normalize,
        case.head.max_seq_length,
    )
    config = TextConfig.from_manifest(m)
    assert m["layer_norms"] == textreference.layer_norm_names(config)
    assert m["config"]["position_offset"] == (case.tiny.pad_token_id + 1 if "roberta" in model_type else 0)
    assert m["config"]["type_vocab_size"] == {"bert": 2, "distilbert": 0}.get(model_type, 1)
    inputs = ["input_ids", "attention_mask"] + (["token_type_ids"] if model_type == "bert" else [])
    assert m["inputs"] == [{"name": n, "datatype": "INT64", "shape": [-1, -1]} for n in inputs]
    stats = [
        {"name": f"{ln}.{s}", "datatype": "FP32", "shape": [-1, -1]} for ln in m["layer_norms"] for s in ("mean", "std")
    ]
    hidden = m["config"]["hidden_size"]
    assert m["outputs"] == [
        {"name": "sentence_embedding", "datatype": "FP32", "shape": [-1, hidden]},
        {"name": "last_hidden_state", "datatype": "FP32", "shape": [-1, -1, hidden]},
        *stats,
    ]
    written = sorted(p.name for p in case.version.iterdir() if p.name != "manifest.json")
    assert m["files"] == {name: hashlib.sha256((case.version / name).read_bytes()).hexdigest() for name in written}
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (case.version / name).read_bytes() == (case.folder / name).read_bytes(), f"{name} copied unchanged"


@pytest.mark.parametrize("case_id", CASES)
def test_the_recorded_parity_is_within_the_bounds(cases: dict[str, Case], case_id: str) -> None:
    parity = cases[case_id].manifest["parity"]
    compared = ["onnx_vs_torch", "onnx_vs_reference"] + (
        ["onnx_vs_sentence_transformers"] if case_id.endswith("-st") else []
    )
    for what in compared:
        bound = REFERENCE_ATOL if what == "onnx_vs_reference" else TOLERANCE
        assert parity[what]["cosine"] >= COSINE_MIN and parity[what]["max_abs"] <= bound, (what, parity[what])
    if not case_id.endswith("-st"):
        assert parity["onnx_vs_sentence_transformers"] is None
    assert parity["tokenizer"]["texts"] == 13 and parity["tokenizer"]["truncated"] >= 1  # one text past the maximum


def _own_tokens(case: Case, texts: list[str]) -> dict[str, np.ndarray]:
    own = transformers.AutoTokenizer.from_pretrained(str(case.folder), local_files_only=True)
    has_types = case.tiny.model_type == "bert"
    enc = own(
        texts,
        padding=True,
        truncation=True,
        max_length=case.head.max_seq_length,
        return_token_type_ids=has_types,
        return_tensors="np",
    )
    return {k: np.asarray(v, dtype=np.int64) for k, v in enc.items()}


@pytest.mark.parametrize("texts", [UNSEEN, UNSEEN[:1]], ids=["padded-batch", "one-text-no-padding"])
@pytest.mark.parametrize("case_id", CASES)
def test_the_written_graph_answers_as_the_users_model_on_unseen_texts(
    cases: dict[str, Case], case_id: str, texts: list[str]
) -> None:
    case = cases[case_id]
    feeds = _own_tokens(case, texts)
    session = ort.InferenceSession(str(case.version / "model.onnx"), providers=["CPUExecutionProvider"])
    got, hidden_got = session.run(["sentence_embedding", "last_hidden_state"], feeds)
    model = transformers.AutoModel.from_pretrained(str(case.tiny.path), attn_implementation="eager").eval()
    with torch.no_grad():
        hidden = (
            model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).last_hidden_state.numpy().astype(np.float64)
        )
    mask = feeds["attention_mask"][:, :, None]
    want = (hidden * mask).sum(1) / mask.sum(1) if case.head.pooling == "mean" else hidden[:, 0]
    if case.head.normalize:
        want = want / np.linalg.norm(want, axis=1, keepdims=True)
    cosine = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() >= COSINE_MIN and np.abs(got - want).max() <= TOLERANCE
    real = feeds["attention_mask"].astype(bool)
    assert np.abs(hidden_got[real] - hidden[real]).max() <= TOLERANCE


@pytest.mark.parametrize("case_id", CASES)
def test_the_written_weights_give_the_graphs_answers_in_the_numpy_reference(
    cases: dict[str, Case], case_id: str
) -> None:
    case = cases[case_id]
    feeds = _own_tokens(case, UNSEEN)
    session = ort.InferenceSession(str(case.version / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(names, feeds), strict=True))
    with np.load(case.version / "weights.npz") as npz:
        weights = {k: npz[k] for k in npz.files}
    ref = textreference.encode(weights, TextConfig.from_manifest(case.manifest), **feeds)
    real = feeds["attention_mask"].astype(bool)
    assert np.abs(got["sentence_embedding"] - ref.sentence_embedding).max() <= REFERENCE_ATOL
    for name, (mean, std) in ref.layer_norms.items():
        assert np.abs(got[f"{name}.mean"][real] - mean[real]).max() <= REFERENCE_ATOL, name
        assert np.abs(got[f"{name}.std"][real] - std[real]).max() <= REFERENCE_ATOL, name


@pytest.mark.parametrize("case_id", CASES)
def test_the_baseline_is_each_layernorms_statistics_at_the_parity_texts_real_tokens(
    cases: dict[str, Case], case_id: str
) -> None:
    case = cases[case_id]
    baseline = case.manifest["baseline"]
    assert baseline["inputs"] == "the parity texts, at real tokens"
    # The names the graph's statistics and the monitor's `layer` label take (the manifest's keys are sorted).
    assert sorted(baseline["layers"]) == sorted(case.manifest["layer_norms"])
    config = TextConfig.from_manifest(case.manifest)
    tokens, _ = served_tokens(case.version, texts(case.head.max_seq_length, None), config, case.head)
    _assert_baseline_is_the_references(case, baseline, tokens)


def _assert_baseline_is_the_references(case: Case, baseline: dict[str, Any], tokens: TextInput) -> None:
    """Each layer's quantiles those of the float64 reference's statistics at the real tokens (the graph's are within
    REFERENCE_ATOL of them, whatever the CPU)."""
    with np.load(case.version / "weights.npz") as npz:
        weights = {k: npz[k] for k in npz.files}
    config = TextConfig.from_manifest(case.manifest)
    ref = textreference.encode(weights, config, tokens.input_ids, tokens.attention_mask, tokens.token_type_ids)
    real = tokens.attention_mask.astype(bool)
    for name, (mean, std) in ref.layer_norms.items():
        want = monitor.baseline(mean[real], std[real]).to_json()
        got = baseline["layers"][name]
        assert (got["count"], got["levels"]) == (int(real.sum()), list(monitor.LEVELS)), name
        for statistic in ("mean", "std"):
            assert np.abs(np.subtract(got[statistic], want[statistic])).max() <= 2 * REFERENCE_ATOL, (name, statistic)


CALIBRATION = [f"calibration text number {i}, {'a little longer ' * (i % 4)}than the last" for i in range(37)]


def test_a_calibration_file_is_the_baseline_of_every_layernorm_in_batches(
    cases: dict[str, Case], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """37 texts: three runs of the graph (16 a run), each padded to its own longest text; blank lines skipped."""
    file = tmp_path / "english.txt"
    file.write_text("\n".join([*CALIBRATION[:20], "", "  ", *CALIBRATION[20:]]) + "\n", encoding="utf-8")
    case = cases["bert"]
    root = tmp_path / "models"
    argv = ["text-encoder", "--name", "bert", "--hf", str(case.folder), "--model-dir", str(root)]
    assert main([*argv, "--calibration", str(file)]) == 0, capsys.readouterr().err
    manifest = json.loads((root / "bert" / "1" / "manifest.json").read_text())
    baseline = manifest["baseline"]
    assert baseline["inputs"] == "--calibration english.txt (37 texts), at real tokens"
    assert sorted(baseline["layers"]) == sorted(manifest["layer_norms"])
    tokens, _ = served_tokens(root / "bert" / "1", CALIBRATION, TextConfig.from_manifest(manifest), case.head)
    _assert_baseline_is_the_references(dataclasses.replace(case, version=root / "bert" / "1"), baseline, tokens)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot be read (No such file or directory)"),
        (b"", "no text in it; expected one text a line"),
        (b"\n   \n\n", "no text in it; expected one text a line"),
        (b"caf\xc3\xa9\nna\xefve\n", "not UTF-8 (byte 0xef at offset 8)"),
    ],
    ids=["missing", "empty", "blank-lines", "latin-1"],
)
def test_a_calibration_file_without_texts_is_refused_naming_it_and_nothing_is_written(
    cases: dict[str, Case], tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, message: str
) -> None:
    file = tmp_path / "calibration.txt"
    if content is not None:
        file.write_bytes(content)
    root = tmp_path / "models"
    argv = ["text-encoder", "--name", "x", "--hf", str(cases["bert"].folder), "--model-dir", str(root)]
    assert main([*argv, "--calibration", str(file)]) == 1
    assert capsys.readouterr().err == f"normserve export: error: --calibration {file}: {message}\n"
    assert not root.exists()


def test_the_served_tokenizer_gives_the_models_own_ids_and_a_changed_id_is_refused(cases: dict[str, Case]) -> None:
    case = cases["bert"]
    tokens, truncated = served_tokens(case.version, UNSEEN, TextConfig.from_manifest(case.manifest), case.head)
    assert check_tokens(case.folder, UNSEEN, tokens, case.head, truncated) == {
        "texts": len(UNSEEN),
        "truncated": 1,
        "checked": ["input_ids", "attention_mask", "token_type_ids"],
    }
    tokens.input_ids[2, 1] += 1
    want = _own_tokens(case, UNSEEN)["input_ids"][2].tolist()
    got = tokens.input_ids[2].tolist()
    message = (
        f"{case.folder / 'tokenizer.json'} gives other input_ids than the model's own tokenizer "
        f"(TokenizersBackend) for text 2 'Two short words': {got} != {want}; nothing written"
    )
    with pytest.raises(TokenizerMismatch) as refused:
        check_tokens(case.folder, UNSEEN, tokens, case.head, truncated)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("flags", "head"),
    [
        ({"pooling": "cls", "normalize": True}, Head("cls", True, 40)),
        ({"max_seq_length": 12, "pooling": "none"}, Head("none", False, 12)),
    ],
    ids=["cls-normalized", "none-12-tokens"],
)
def test_flags_override_the_folders_head(
    cases: dict[str, Case], tmp_path: Path, flags: dict[str, Any], head: Head
) -> None:
    done = export_text_encoder(tmp_path, "bert", cases["bert"].folder, **flags)
    m = done.manifest
    assert (m["pooling"], m["normalize"], m["max_seq_length"]) == (head.pooling, head.normalize, head.max_seq_length)
    assert m["parity"]["onnx_vs_torch"]["max_abs"] <= TOLERANCE


def test_flags_that_change_a_sentence_transformers_head_skip_its_comparison(
    cases: dict[str, Case], tmp_path: Path
) -> None:
    done = export_text_encoder(tmp_path, "st", cases["roberta-st"].folder, pooling="mean")
    assert done.manifest["parity"]["onnx_vs_sentence_transformers"] is None
    assert done.manifest["pooling"] == "mean"


def test_a_failed_parity_writes_nothing(cases: dict[str, Case], tmp_path: Path) -> None:
    root = tmp_path / "models"
    with pytest.raises(
        Exception,
        match=r"^parity failed for x: onnx_vs_torch: worst cosine .*, max abs .* \(bounds: cosine at least 0\.99999, max abs at most 1e-12\) on 13 texts; nothing written$",
    ):
        export_text_encoder(root, "x", cases["distilbert"].folder, tolerance=1e-12)
    assert not root.exists()


def test_the_command_exports_with_its_flags_and_check_texts(
    cases: dict[str, Case], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("first text of mine\n\nsecond, with ünïcode ✓\n", encoding="utf-8")
    root = tmp_path / "models"
    argv = ["text-encoder", "--name", "xlmr", "--hf", str(cases["xlm-roberta"].folder), "--model-dir", str(root)]
    assert main([*argv, "--check-texts", str(texts), "--version", "3", "--no-normalize"]) == 0
    assert capsys.readouterr().out == f"exported xlmr version 3 to {root / 'xlmr' / '3'}\n"
    manifest = json.loads((root / "xlmr" / "3" / "manifest.json").read_text())
    assert manifest["parity"]["tokenizer"]["texts"] == 15  # 13 built in, two of the file's (its empty line skipped)


@pytest.mark.parametrize("case_id", ["bert", "roberta-st"])
def test_exporting_a_folder_again_writes_the_same_bytes(cases: dict[str, Case], tmp_path: Path, case_id: str) -> None:
    again = export_text_encoder(tmp_path, case_id, cases[case_id].folder)
    assert again.manifest["files"] == cases[case_id].manifest["files"]


def test_a_sentence_transformers_folder_that_lower_cases_is_served_lower_cased(
    cases: dict[str, Case], tmp_path: Path
) -> None:
    """RoBERTa's byte-level BPE keeps case: only lower-casing the texts as sentence-transformers does meets its encode."""
    folder = tmp_path / "st-lower"
    shutil.copytree(cases["roberta-st"].folder, folder)
    settings = json.loads((folder / "sentence_bert_config.json").read_text())
    (folder / "sentence_bert_config.json").write_text(json.dumps(settings | {"do_lower_case": True}))
    done = export_text_encoder(tmp_path / "models", "lower", folder)
    assert done.manifest["do_lower_case"] is True
    vs_st = done.manifest["parity"]["onnx_vs_sentence_transformers"]
    assert vs_st["cosine"] >= COSINE_MIN and vs_st["max_abs"] <= TOLERANCE
