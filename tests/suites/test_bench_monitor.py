"""The monitor-cost section's code path end to end, tiny and fast: the repo's layernorm and encoder and a tiny BERT
exported as the text encoder, the monitor's work timed in process, a real server's CPU per request over HTTP, and the
report's table with the goal's verdict. No timing asserted."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks/ lives beside app/ in the checkout, as scripts/bench.py finds it

from benchmarks import monitorcost, sections  # noqa: E402
from tests.textmodels import tiny_model  # noqa: E402

REQUESTS = [
    "/normalize (1,8,64) 0.00195 MiB",
    "/normalize (8,128,768) 3 MiB",
    "/encode (1,128,128) 0.0625 MiB",
    "/v1/embeddings, 4 sentences",
]


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("monitor")
    tiny = tiny_model(folder / "hf", "bert")
    plan = monitorcost.MonitorPlan(tiny.path, seconds=0.3, budget_s=0.05, work_dir=folder / "work")
    return monitorcost.monitor_section(plan, lambda _message: None)


def test_every_request_kind_has_its_row_in_order(measured: list[dict[str, Any]]) -> None:
    assert [r["request"] for r in measured] == REQUESTS


@pytest.mark.parametrize(
    ("request_kind", "positions", "layers"),
    [(REQUESTS[0], 8, 1), (REQUESTS[1], 8 * 128, 1), (REQUESTS[2], 128, 4)],
    ids=["small-normalize", "large-normalize", "encode"],
)
def test_the_monitor_counts_each_position_in_every_layernorm(
    measured: list[dict[str, Any]], request_kind: str, positions: int, layers: int
) -> None:
    (row,) = [r for r in measured if r["request"] == request_kind]
    assert (row["positions"], row["layers"]) == (positions, layers)


def test_the_text_encoder_counts_its_real_tokens_in_its_five_layernorms(measured: list[dict[str, Any]]) -> None:
    """The tiny BERT: the embeddings' LayerNorm and two per layer (2 layers); no padding counted."""
    text = measured[3]
    assert text["layers"] == 5
    assert 4 * 3 <= text["positions"] < 4 * 40  # each text: [CLS], a word at least, [SEP]; under the maximum


@pytest.mark.parametrize("figure", ["observe_us", "monitor_us", "server_cpu_us"])
def test_every_row_has_positive_figures_and_its_shares(measured: list[dict[str, Any]], figure: str) -> None:
    for r in measured:
        assert r[figure] > 0, r
        assert r["of_own"] == pytest.approx(r["monitor_us"] / r["server_cpu_us"])
        assert r["of_small"] == pytest.approx(r["monitor_us"] / measured[0]["server_cpu_us"])


def test_the_report_has_the_section_with_a_row_each_and_the_goals_verdict(measured: list[dict[str, Any]]) -> None:
    text = "\n".join(sections.sections({"monitor": measured}))
    assert text.startswith("## The drift monitor's cost per request\n")
    verdict = "met" if measured[0]["of_small"] <= monitorcost.GOAL else "missed"
    assert f"Goal: at most 5% of a small /normalize's server CPU: {verdict} ({measured[0]['of_small']:.1%})" in text
    assert [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| /")] == [
        f"| {r}" for r in REQUESTS
    ]
