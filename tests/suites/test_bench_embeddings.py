"""The embeddings section's code path end to end, tiny and fast: a tiny BERT as a sentence-transformers folder, its
floor graph, normserve's export (FP32 and INT8), the sentence-transformers peer over HTTP and normserve's server,
pinned; the report's table and goals. No timing asserted."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks/ lives beside app/ in the checkout, as scripts/bench.py finds it

from benchmarks import embeddings, embedreport, embedrows, sections  # noqa: E402
from tests.textmodels import sentence_transformers_folder, tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("tiny")
    tiny = tiny_model(folder / "hf", "bert")
    st = sentence_transformers_folder(tiny, folder / "st", "mean", True, 32)
    plan = embedrows.EmbeddingsPlan(
        st,
        seconds=0.3,
        rounds=2,
        inprocess_s=0.05,
        n_texts=8,
        batch=4,
        short_requests=5,
        servers=(embedrows.ST, embedrows.NORMSERVE),
        warm_s=0.1,
        work_dir=folder / "work",
        words=(5, 12),
    )
    return embeddings.embeddings_section(plan, lambda _message: None)


def test_texts_are_the_same_every_run_and_of_the_asked_lengths() -> None:
    corpus = embedrows.texts(16, 70, 110)
    assert corpus == embedrows.texts(16, 70, 110) and len(corpus) == 16
    assert all(70 <= len(t.split()) <= 110 for t in corpus)


@pytest.mark.parametrize("row", [embedrows.FLOOR, embedrows.INPROCESS, embedrows.ST])
def test_each_row_ran_every_round(measured: dict[str, Any], row: str) -> None:
    (found,) = [r for r in measured["rows"] if r["row"] == row]
    assert len(found["runs"]) == 2 and found["sentences_per_s"] > 0
    assert measured["short_p50_ms"][row] > 0
    assert found.get("errors", 0) == 0


def test_a_server_without_the_route_is_named_not_available(measured: dict[str, Any]) -> None:
    """Until POST /v1/embeddings exists, normserve's HTTP rows say so (detected with a request), not a failure."""
    route = any(r["row"] == embedrows.NORMSERVE for r in measured["rows"])
    why = measured["skipped"].get(embedrows.NORMSERVE, "")
    assert route or why == "not available: POST /v1/embeddings answered 404", measured["skipped"]


def test_the_report_has_the_table_the_profile_and_the_goals(measured: dict[str, Any]) -> None:
    text = "".join(sections.sections({"embeddings": measured}))
    assert "## Embeddings per core (issue 39)" in text
    assert "| row | sentences/s per core | server CPU ms/sentence | short text alone: p50 ms |" in text
    assert f"| {embedreport.LABELS[embedrows.FLOOR]} | " in text
    assert "Where normserve's in-process time goes: tokenizer ms/sentence " in text
    assert "| goal | measured | verdict |" in text
    assert measured["server_cpu"] != measured["load_cpu"]
