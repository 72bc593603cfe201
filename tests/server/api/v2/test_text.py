"""A text encoder over the Open Inference Protocol, HTTP and gRPC, driven by tritonclient: `text` as BYTES (JSON
strings, length-prefixed binary data, raw_input_contents) or the INT64 token inputs, each answer equal to
/v1/embeddings' for the same texts (1e-5); its metadata and config describe both; invalid UTF-8 is a 400 naming
the input."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.core.test_textencoder import MAX_LEN, USER_ATOL, USER_COSINE, cosines, users_model
from tests.live_server import ROOT
from tests.server.api.v2.grpc.live import GrpcServer, grpc_server

pytest.importorskip("torch")
th = pytest.importorskip("tritonclient.http")
tg = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402 - after the skip

TEXTS = ["The quick brown fox.", "Café naïve façade, déjà vu!", "東京は日本の首都です。", "Emoji 🙂 too"]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The exported versions under models/, named by model_type; the user's HF folders under hf/."""
    from app.export.textexport import export_text_encoder
    from tests.textmodels import tiny_model

    root = tmp_path_factory.mktemp("v2text")
    for seed, model_type in enumerate(("bert", "roberta")):
        tiny = tiny_model(root / "hf" / model_type, model_type, seed=seed)
        export_text_encoder(root / "models", model_type, tiny.path, max_seq_length=MAX_LEN)
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[GrpcServer]:
    root = repository
    # A budget of 128 tokens cuts pooled texts into several length groups; a batch waits up to 0.1 s for the others
    # in flight (a request alone never waits), so that concurrent requests do pool; and a gRPC call holds room for
    # a message of 1 MiB, not 64, so that 24 of them are in flight at once.
    env = {
        "NORMSERVE_MODEL_DIR": str(root / "models"),
        "NORMSERVE_TEXT_BATCH_TOKENS": "128",
        "NORMSERVE_BATCH_DELAY_US": "100000",
        "NORMSERVE_MAX_BODY_BYTES": str(1 << 20),
    }
    with grpc_server(root, env) as s:
        yield s


def embeddings(server: GrpcServer, model: str) -> np.ndarray:
    answer = httpx.post(f"{server.base}/v1/embeddings", json={"model": model, "input": TEXTS}, timeout=30).json()
    return np.array([d["embedding"] for d in answer["data"]], dtype=np.float32)


def token_arrays(server: GrpcServer, model: str) -> tuple[np.ndarray, np.ndarray]:
    """/tokenize's ids, right-padded with 0 under a 0 mask (the pad value is the mask's to ignore)."""
    data = httpx.post(f"{server.base}/tokenize", json={"model": model, "input": TEXTS}, timeout=30).json()["data"]
    width = max(len(d["ids"]) for d in data)
    ids, mask = np.zeros((len(data), width), np.int64), np.zeros((len(data), width), np.int64)
    for i, d in enumerate(data):
        ids[i, : len(d["ids"])], mask[i, : len(d["ids"])] = d["ids"], 1
    return ids, mask


def infer(
    server: GrpcServer,
    protocol: str,
    model: str,
    tensors: dict[str, np.ndarray],
    binary: bool,
    names: tuple[str, ...] = ("sentence_embedding",),
) -> Any:
    """The output `names` by tritonclient: the first alone as an array, several as a dict."""
    module, client = (
        (th, th.InferenceServerClient(server.base.removeprefix("http://")))
        if protocol == "http"
        else (tg, tg.InferenceServerClient(server.address))
    )
    try:
        inputs = []
        for name, arr in tensors.items():
            inputs.append(module.InferInput(name, list(arr.shape), "BYTES" if arr.dtype == object else "INT64"))
            if protocol == "http":
                inputs[-1].set_data_from_numpy(arr, binary_data=binary)
            else:
                inputs[-1].set_data_from_numpy(arr)
        answer = client.infer(model, inputs, outputs=[module.InferRequestedOutput(n) for n in names])
        got = {n: answer.as_numpy(n) for n in names}
        return got[names[0]] if len(names) == 1 else got
    finally:
        client.close()


TRANSPORTS = [("http", False), ("http", True), ("grpc", True)]


@pytest.mark.parametrize("model", ["bert", "roberta"])
@pytest.mark.parametrize(("protocol", "binary"), TRANSPORTS, ids=["http-json", "http-binary", "grpc"])
def test_text_as_bytes_answers_as_v1_embeddings(server: GrpcServer, model: str, protocol: str, binary: bool) -> None:
    texts = np.array([t.encode() for t in TEXTS], dtype=object)
    got = infer(server, protocol, model, {"text": texts}, binary)
    np.testing.assert_allclose(got, embeddings(server, model), rtol=0, atol=1e-5)


@pytest.mark.parametrize("model", ["bert", "roberta"])
@pytest.mark.parametrize(("protocol", "binary"), TRANSPORTS, ids=["http-json", "http-binary", "grpc"])
def test_token_ids_answer_as_their_text(server: GrpcServer, model: str, protocol: str, binary: bool) -> None:
    ids, mask = token_arrays(server, model)
    got = infer(server, protocol, model, {"input_ids": ids, "attention_mask": mask}, binary)
    np.testing.assert_allclose(got, embeddings(server, model), rtol=0, atol=1e-5)


def executions(server: GrpcServer, model: str) -> int:
    stats = httpx.get(f"{server.base}/v2/models/{model}/stats", timeout=30).json()
    return sum(int(m["execution_count"]) for m in stats["model_stats"])


MIXED = [" ".join(["word"] * (1 + (i * 7) % 30)) + f" {i}" for i in range(24)]  # 3 to 24 tokens, some cut at 24


@pytest.mark.parametrize(("protocol", "binary"), TRANSPORTS, ids=["http-json", "http-binary", "grpc"])
def test_concurrent_text_requests_pool_and_each_answers_as_its_text_alone(
    server: GrpcServer, protocol: str, binary: bool
) -> None:
    """24 requests of two texts of mixed lengths at once are pooled by length (fewer runs than requests, as one
    request alone is one run), and every text's embedding and hidden states equal those of that text sent alone."""
    names = ("sentence_embedding", "last_hidden_state")

    def ask(texts: list[str]) -> dict[str, np.ndarray]:
        tensors = {"text": np.array([t.encode() for t in texts], dtype=object)}
        answer: dict[str, np.ndarray] = infer(server, protocol, "roberta", tensors, binary, names)
        return answer

    alone = [ask([t]) for t in MIXED]
    pairs = [[t, MIXED[(i + 5) % 24]] for i, t in enumerate(MIXED)]
    tokens = httpx.post(f"{server.base}/tokenize", json={"model": "roberta", "input": MIXED}, timeout=30).json()
    lengths = [len(d["ids"]) for d in tokens["data"]]
    before = executions(server, "roberta")
    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(ask, pairs))
    runs = executions(server, "roberta") - before
    assert runs < len(pairs), f"{runs} runs for {len(pairs)} requests: they were not pooled"
    for i, answer in enumerate(answers):
        for row, k in enumerate((i, (i + 5) % 24)):
            n = lengths[k]
            np.testing.assert_allclose(answer["sentence_embedding"][row], alone[k]["sentence_embedding"][0], atol=1e-5)
            got_hidden, want_hidden = answer["last_hidden_state"][row], alone[k]["last_hidden_state"][0]
            np.testing.assert_allclose(got_hidden[:n], want_hidden[:n], rtol=0, atol=1e-5)
            assert not got_hidden[n:].any()  # padding carries nothing


@pytest.fixture(scope="module")
def kserve_answers(server: GrpcServer) -> dict[str, dict[str, Any]]:
    """What KServe's REST and gRPC clients got for TEXTS and their ids, per model (one process: see the client)."""
    answers = {}
    for model in ("bert", "roberta"):
        ids, mask = token_arrays(server, model)
        request = {"texts": TEXTS, "input_ids": ids.tolist(), "attention_mask": mask.tolist()}
        command = [sys.executable, "-m", "tests.server.api.v2.kserve_text_client", server.base, server.address, model]
        done = subprocess.run([*command, json.dumps(request)], cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        answers[model] = json.loads(done.stdout.splitlines()[-1])
    return answers


@pytest.mark.parametrize("model", ["bert", "roberta"])
@pytest.mark.parametrize("client", ["rest", "grpc"])
@pytest.mark.parametrize("what", ["text", "ids"])
@pytest.mark.parametrize("way", ["json", "binary"])
def test_kserves_clients_get_the_users_model(
    repository: Path, kserve_answers: dict[str, dict[str, Any]], model: str, client: str, what: str, way: str
) -> None:
    """KServe's clients, texts as BYTES or their token ids as INT64, each in JSON (gRPC: typed contents) and binary
    (gRPC: raw_input_contents): the user's own model's embeddings (cosine >= 0.99999, max abs <= 2e-5)."""
    got = np.array(kserve_answers[model][f"{client}-{what}-{way}"])
    theirs = users_model(repository, model, TEXTS)
    assert got.shape == theirs.shape
    assert np.abs(got - theirs).max() <= USER_ATOL and cosines(got, theirs).min() >= USER_COSINE


def test_metadata_and_config_describe_text_and_tokens(server: GrpcServer) -> None:
    metadata = httpx.get(f"{server.base}/v2/models/bert", timeout=30).json()
    config = httpx.get(f"{server.base}/v2/models/bert/config", timeout=30).json()
    assert metadata["inputs"] == [
        {"name": "text", "datatype": "BYTES", "shape": [-1]},
        *(
            {"name": n, "datatype": "INT64", "shape": [-1, -1]}
            for n in ("input_ids", "attention_mask", "token_type_ids")
        ),
    ]
    assert [(t["name"], t["data_type"], t["optional"]) for t in config["input"]] == [
        ("text", "TYPE_STRING", True),
        *((n, "TYPE_INT64", True) for n in ("input_ids", "attention_mask", "token_type_ids")),
    ]


def raw_http(server: GrpcServer, inputs: list[dict[str, Any]], binary: bytes = b"") -> httpx.Response:
    header = json.dumps({"inputs": inputs}).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))} if binary else {}
    return httpx.post(f"{server.base}/v2/models/bert/infer", content=header + binary, headers=headers, timeout=30)


def prefixed(*items: bytes) -> bytes:
    return b"".join(len(i).to_bytes(4, "little") + i for i in items)


@pytest.mark.parametrize(
    ("inputs", "binary", "status", "message"),
    [
        (
            [{"name": "text", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 13}}],
            prefixed(b"ok", b"\xff\xfe\xfd"),
            400,
            "inputs.text[1]: invalid UTF-8 at byte 0; expected UTF-8 text",
        ),
        (
            [{"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}],
            (9).to_bytes(4, "little") + b"ab",
            400,
            "inputs.text.parameters.binary_data_size: element 0 declares 9 bytes, but 2 follow",
        ),
        (
            [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", 3]}],
            b"",
            400,
            "inputs.text.data[1]: 3; expected a string",
        ),
        (
            [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", ""]}],
            b"",
            400,
            "inputs.text[1]: ''; expected a non-empty string",
        ),
        (
            [{"name": "attention_mask", "datatype": "INT64", "shape": [1, 2], "data": [1, 1]}],
            b"",
            400,
            "inputs: expected text (BYTES), or input_ids and attention_mask (INT64) for model 'bert'",
        ),
        (
            [
                {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]},
                {"name": "input_ids", "datatype": "INT64", "shape": [1, 1], "data": [2]},
            ],
            b"",
            400,
            "inputs.text: send text or the token inputs (input_ids, attention_mask, token_type_ids), not both",
        ),
        (
            [
                {"name": "input_ids", "datatype": "INT64", "shape": [1, 2], "data": [2, 9999]},
                {"name": "attention_mask", "datatype": "INT64", "shape": [1, 2], "data": [1, 1]},
            ],
            b"",
            400,
            "inputs.input_ids[0][1]: token id 9999 is outside the vocabulary; expected 0 <= id < 300",
        ),
    ],
)
def test_bad_text_input_is_a_400_naming_it(
    server: GrpcServer, inputs: list[dict[str, Any]], binary: bytes, status: int, message: str
) -> None:
    answer = raw_http(server, inputs, binary)
    assert (answer.status_code, answer.json()) == (status, {"error": message})


def test_invalid_utf8_over_grpc_is_invalid_argument_naming_the_input(server: GrpcServer) -> None:
    client = tg.InferenceServerClient(server.address)
    try:
        text = tg.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"\xc3("], dtype=object))
        with pytest.raises(InferenceServerException) as e:
            client.infer("bert", [text])
    finally:
        client.close()
    assert (e.value.status(), e.value.message()) == (
        "StatusCode.INVALID_ARGUMENT",
        "inputs.text[0]: invalid UTF-8 at byte 0; expected UTF-8 text",
    )


def test_an_answer_without_named_outputs_carries_every_output(server: GrpcServer, tmp_path: Path) -> None:
    answer = raw_http(server, [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [TEXTS[0]]}])
    names = [o["name"] for o in answer.json()["outputs"]]
    assert answer.status_code == 200
    assert names[:2] == ["sentence_embedding", "last_hidden_state"] and names[2] == "embeddings.LayerNorm.mean"
