"""/v1/embeddings, /v1/models and /tokenize on a real server: tiny random BERT and RoBERTa (tests/textmodels.py)
exported into a repository beside a layernorm model, driven by the official `openai` client and by httpx.

Embeddings are held to the user's own model (torch, eval mode, mean pooling: cosine >= 0.99999, max abs <= 2e-5),
ids to the model's own tokenizer (transformers' AutoTokenizer), and each answer to its text sent alone (1e-5).
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.core.test_textencoder import MAX_LEN, TEXTS, USER_ATOL, USER_COSINE, cosines, users_model
from tests.live_server import MODELS, live_server

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

MODEL_TYPES = ("bert", "roberta")
WIDTH = 32  # tests/textmodels.py's hidden size
MAX_REQUEST_TOKENS = 2000


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One exported version per architecture, named by its model_type, the HF folders under hf/; and a layernorm."""
    from app.export.textexport import export_text_encoder
    from tests.textmodels import tiny_model

    root = tmp_path_factory.mktemp("openai")
    for seed, model_type in enumerate(MODEL_TYPES):
        tiny = tiny_model(root / "hf" / model_type, model_type, seed=seed)
        export_text_encoder(root / "models", model_type, tiny.path, max_seq_length=MAX_LEN)
    shutil.copytree(MODELS / "layernorm", root / "models" / "layernorm")
    return root


@pytest.fixture(scope="module")
def base(repository: Path) -> Iterator[str]:
    # A token budget of 64 splits TEXTS into several length groups, as concurrent requests would be.
    env = {
        "NORMSERVE_MODEL_DIR": str(repository / "models"),
        "NORMSERVE_TEXT_BATCH_TOKENS": "64",
        "NORMSERVE_MAX_REQUEST_TOKENS": str(MAX_REQUEST_TOKENS),
    }
    with live_server(env) as url:
        yield url


def client(base: str) -> Any:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="any key", max_retries=0)


def embed(base: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base}/v1/embeddings", json=body, timeout=60)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("encoding_format", ["base64", "float"])
def test_the_openai_client_gets_the_users_model(
    base: str, repository: Path, model_type: str, encoding_format: str
) -> None:
    """The client asks for base64 by default and decodes it itself; float comes as JSON numbers."""
    kwargs = {} if encoding_format == "base64" else {"encoding_format": "float"}
    answer = client(base).embeddings.create(model=model_type, input=TEXTS, **kwargs)
    got = np.array([d.embedding for d in answer.data])
    theirs = users_model(repository, model_type, TEXTS)
    assert got.shape == (len(TEXTS), WIDTH)
    assert [d.index for d in answer.data] == list(range(len(TEXTS)))
    assert np.abs(got - theirs).max() <= USER_ATOL and cosines(got, theirs).min() >= USER_COSINE
    tokenizer = transformers.AutoTokenizer.from_pretrained(repository / "hf" / model_type)
    tokens = sum(len(ids) for ids in tokenizer(TEXTS, truncation=True, max_length=MAX_LEN)["input_ids"])
    assert (answer.model, answer.usage.prompt_tokens, answer.usage.total_tokens) == (model_type, tokens, tokens)


def test_base64_is_little_endian_float32_of_the_float_answer(base: str) -> None:
    floats = embed(base, {"model": "bert", "input": TEXTS[0], "encoding_format": "float"}).json()
    packed = embed(base, {"model": "bert", "input": TEXTS[0], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.array(floats["data"][0]["embedding"], dtype=np.float32))


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_token_ids_answer_as_the_text_they_tokenize_to(base: str, model_type: str) -> None:
    tokens = httpx.post(f"{base}/tokenize", json={"model": model_type, "input": TEXTS}, timeout=30).json()
    ids = [t["ids"] for t in tokens["data"]]
    by_text = embed(base, {"model": model_type, "input": TEXTS}).json()
    by_ids = embed(base, {"model": model_type, "input": ids}).json()
    one = embed(base, {"model": model_type, "input": ids[0]}).json()
    assert by_ids["usage"] == by_text["usage"]
    for a, b in zip(by_text["data"], by_ids["data"], strict=True):
        np.testing.assert_allclose(a["embedding"], b["embedding"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(one["data"][0]["embedding"], by_text["data"][0]["embedding"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_tokenize_gives_the_models_own_tokenizers_ids_and_tokens(base: str, repository: Path, model_type: str) -> None:
    """Accents, CJK, emoji, special tokens, and the last text cut at the maximum length."""
    answer = httpx.post(f"{base}/tokenize", json={"model": model_type, "input": TEXTS}, timeout=30)
    tokenizer = transformers.AutoTokenizer.from_pretrained(repository / "hf" / model_type)
    ids = tokenizer(TEXTS, truncation=True, max_length=MAX_LEN)["input_ids"]
    expected = [{"ids": i, "tokens": tokenizer.convert_ids_to_tokens(i)} for i in ids]
    usage = {"prompt_tokens": sum(len(i) for i in ids)}
    assert answer.status_code == 200
    assert answer.json() == {"model": model_type, "data": expected, "usage": usage}
    assert len(ids[-1]) == MAX_LEN
    one = httpx.post(f"{base}/tokenize", json={"model": model_type, "input": TEXTS[1]}, timeout=30)
    assert one.json()["data"] == expected[1:2]


def test_24_concurrent_requests_each_answer_as_its_text_alone(base: str) -> None:
    """Mixed lengths, sent at once: whatever they were grouped with, each equals its text sent alone."""
    texts = [" ".join(["word"] * (1 + (i * 7) % 30)) + f" {i}" for i in range(24)]
    alone = [embed(base, {"model": "roberta", "input": t}).json()["data"][0]["embedding"] for t in texts]
    bodies = [{"model": "roberta", "input": [t, texts[(i + 5) % 24]]} for i, t in enumerate(texts)]
    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(lambda b: embed(base, b), bodies))
    for i, answer in enumerate(answers):
        assert answer.status_code == 200
        data = answer.json()["data"]
        np.testing.assert_allclose(data[0]["embedding"], alone[i], rtol=0, atol=1e-5)
        np.testing.assert_allclose(data[1]["embedding"], alone[(i + 5) % 24], rtol=0, atol=1e-5)


def test_return_layer_norms_gives_each_layer_norms_statistics_per_token(base: str, repository: Path) -> None:
    """Per text, each LayerNorm of the manifest in order, with one mean and std per token of that text; the same
    whichever other texts were sent with it."""
    import json

    names = json.loads((repository / "models" / "bert" / "1" / "manifest.json").read_text())["layer_norms"]
    both = embed(base, {"model": "bert", "input": TEXTS[:2], "return_layer_norms": True}).json()
    alone = embed(base, {"model": "bert", "input": TEXTS[1], "return_layer_norms": True}).json()
    plain = embed(base, {"model": "bert", "input": TEXTS[1]}).json()
    tokens = httpx.post(f"{base}/tokenize", json={"model": "bert", "input": TEXTS[:2]}, timeout=30).json()
    for item, ids in zip(both["data"], tokens["data"], strict=True):
        assert [ln["name"] for ln in item["layer_norms"]] == names
        assert all(len(ln["mean"]) == len(ln["std"]) == len(ids["ids"]) for ln in item["layer_norms"])
    for a, b in zip(both["data"][1]["layer_norms"], alone["data"][0]["layer_norms"], strict=True):
        np.testing.assert_allclose(a["mean"], b["mean"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(a["std"], b["std"], rtol=0, atol=1e-5)
    assert "layer_norms" not in plain["data"][0]


def test_models_lists_the_text_encoders(base: str) -> None:
    listed = client(base).models.list()
    assert [(m.id, m.object, m.owned_by) for m in listed.data] == [
        ("bert", "model", "normserve"),
        ("roberta", "model", "normserve"),
    ]


LONG = " ".join(["this sentence goes on past the maximum length"] * 6)
BAD = [
    ({"model": "bert", "input": ""}, 400, "input[0]", "input[0]: ''; expected a non-empty string"),
    ({"model": "bert", "input": ["a", 3]}, 400, "input[1]", "input[1]: 3; expected a non-empty string"),
    ({"model": "bert", "input": ["a", None]}, 400, "input[1]", "input[1]: None; expected a non-empty string"),
    (
        {"model": "bert", "input": []},
        400,
        "input",
        "input: []; expected a string, a non-empty list of strings, or token ids (a list of ints, or of lists of ints)",
    ),
    (
        {"model": "bert", "input": [[2, 5], [2, 300, 3]]},
        400,
        "input[1][1]",
        "input[1][1]: token id 300 is outside the vocabulary; expected 0 <= id < 300",
    ),
    (
        {"model": "bert", "input": [2, 5, 300]},
        400,
        "input[2]",
        "input[2]: token id 300 is outside the vocabulary; expected 0 <= id < 300",
    ),
    (
        {"model": "bert", "input": [[2] * 25]},
        400,
        "input[0]",
        "input[0]: 25 token ids; the model takes at most 24",
    ),
    (
        {"model": "bert", "input": ["short", LONG], "truncate": False},
        400,
        "input[1]",
        "input[1]: longer than the model's maximum of 24 tokens (truncate: true cuts it there)",
    ),
    (
        {"model": "bert", "input": ["a"] * 2049},
        400,
        "input",
        "input: 2049 inputs; at most 2048 per request",
    ),
    (
        {"model": "bert", "input": [LONG] * 100},
        413,
        "input",
        f"input: 2400 tokens; at most {MAX_REQUEST_TOKENS} per request (NORMSERVE_MAX_REQUEST_TOKENS)",
    ),
    (
        {"model": "bert", "input": "a", "dimensions": 16},
        400,
        "dimensions",
        "dimensions: 16; model 'bert' gives 32 dimensions and declares no Matryoshka sizes",
    ),
    (
        {"model": "layernorm", "input": "a"},
        400,
        "model",
        "model: 'layernorm' is of kind layernorm; this route takes the kind text-encoder",
    ),
    (
        {"model": "nope", "input": "a"},
        404,
        "model",
        "model: unknown model 'nope'; available: bert, layernorm, roberta",
    ),
    (
        {"model": "bert", "input": "a", "encoding_format": "int8"},
        400,
        "encoding_format",
        "encoding_format: Input should be 'float' or 'base64' (got 'int8')",
    ),
    (
        {"model": "bert", "input": "a", "size": 3},
        400,
        "size",
        "size: unknown field; expected only model, input, encoding_format, dimensions, user, truncate, "
        "return_layer_norms",
    ),
    ({"input": "a"}, 400, "model", "model: field required"),
]


@pytest.mark.parametrize(("body", "status", "param", "message"), BAD)
def test_bad_input_is_refused_in_openais_shape_naming_it(
    base: str, body: dict[str, Any], status: int, param: str, message: str
) -> None:
    answer = embed(base, body)
    code = {404: "model_not_found", 413: "request_too_large"}.get(status)
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    assert (answer.status_code, answer.json()) == (
        status,
        {"error": {"message": message, "type": kind, "param": param, "code": code}},
    )


@pytest.mark.parametrize(
    ("body", "error_class"),
    [
        ({"model": "bert", "input": ""}, "BadRequestError"),
        ({"model": "nope", "input": "a"}, "NotFoundError"),
    ],
)
def test_the_openai_client_raises_its_own_class_with_the_message(
    base: str, body: dict[str, Any], error_class: str
) -> None:
    expected = embed(base, body).json()["error"]
    with pytest.raises(getattr(openai, error_class)) as raised:
        client(base).embeddings.create(**body)
    assert raised.value.body == expected
    assert expected["message"] in str(raised.value)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"model": "bert", "input": []}, 400, "input: []; expected a string or a non-empty list of strings"),
        ({"model": "bert", "input": ["a", ""]}, 400, "input[1]: ''; expected a non-empty string"),
        ({"model": "bert", "input": ["a"] * 2049}, 400, "input: 2049 inputs; at most 2048 per request"),
        (
            {"model": "layernorm", "input": "a"},
            400,
            "model: 'layernorm' is of kind layernorm; this route takes the kind text-encoder",
        ),
        ({"model": "nope", "input": "a"}, 404, "model: unknown model 'nope'; available: bert, layernorm, roberta"),
    ],
)
def test_tokenize_refuses_bad_input_naming_it(base: str, body: dict[str, Any], status: int, message: str) -> None:
    answer = httpx.post(f"{base}/tokenize", json=body, timeout=30)
    assert answer.status_code == status
    assert answer.json()["error"]["message"] == message


def test_a_body_that_is_not_json_is_a_400_in_openais_shape(base: str) -> None:
    answer = httpx.post(f"{base}/v1/embeddings", content=b"{not json", timeout=30)
    error = answer.json()["error"]
    assert (answer.status_code, error["type"], error["param"]) == (400, "invalid_request_error", "body")
