"""The benchmark's code path end to end, tiny and fast: real servers, real load, the report; no timing asserted."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks/ lives beside app/ in the checkout, as scripts/bench.py finds it

from benchmarks import pinned, suite  # noqa: E402
from benchmarks.floors import GRPC_FLOOR  # noqa: E402
from benchmarks.serving import HALF, TRACED, TRIVIAL, HttpPlan  # noqa: E402

SECTION_HEADINGS = [
    "## Machine and versions",
    "## Headline: the cost per core, each server pinned to one core",
    "## Targets",
    "## 1. In process: the floor",
    "### onnxruntime intra-op threads",
    "### Cost of the statistics outputs",
    "### The encoder in process against torch's",
    "### The floor of a V2 binary request",
    "## 2. Codec costs",
    "## 3. Over HTTP on 127.0.0.1",
    "## Half precision: V2 binary FP16 beside FP32, per byte moved",
    "## 4. /encode with dynamic batching off and on",
    "## 5. Peak memory of a worker serving one large request",
]


def tiny(out_dir: Path) -> suite.Config:
    """The quick run's code path on tiny shapes, 0.3 s per HTTP cell, the naive peer and the floors; no KServe or
    MLServer (their venvs take a minute or more to create: `--quick --with-kserve --with-mlserver` runs them).
    The pinned headline: the small case with the trivial app and the naive peer, two rounds of 0.3 s, then one
    second of py-spy on normserve's worker."""
    shapes = [(1, 8, 64), (2, 4, 32)]
    headline = pinned.PinnedPlan(
        [pinned.PinnedCase((1, 8, 64), 8, ("normserve", TRIVIAL, "naive"))], 0.3, rounds=2, warm_s=0.1, profile_s=1.0
    )
    plan = HttpPlan(shapes, [1, 2], 0.3, ["normserve", TRACED, TRIVIAL, "naive"], skip=suite._floor_cell)
    return suite.Config(
        out_dir=out_dir,
        mode="quick",
        floor_shapes=shapes,
        codec_shapes=shapes,
        budget_s=0.01,
        http=plan,
        encode_shapes=[(1, 4, 128)],
        encode_concurrencies=[1, 4],
        encode_seconds=0.3,
        memory_bytes=1 << 20,
        floor_shape=(2, 4, 32),
        pinned=headline,
        torch_encoder_shapes=[(1, 4, 128)],
        fidelity=False,  # scripts/fidelity.py has its own tests
        profile_requests=5,
        note="smoke test",
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench")
    return out, suite.run(tiny(out))


def test_the_report_and_its_plot_are_written(report: tuple[Path, dict[str, Any]]) -> None:
    out, _ = report
    text = (out / "benchmarks.md").read_text()
    png = (out / "benchmarks.png").read_bytes()
    assert (out / "benchmarks.json").is_file()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    assert "smoke test" in text and "cores (os.cpu_count)" in text


@pytest.mark.parametrize("heading", SECTION_HEADINGS)
def test_every_section_has_its_table(report: tuple[Path, dict[str, Any]], heading: str) -> None:
    text = (report[0] / "benchmarks.md").read_text()
    assert heading in text
    after = text.split(heading, 1)[1]
    assert after.lstrip().split("\n## ")[0].count("\n|") >= 2, f"{heading} has no table rows"


@pytest.mark.parametrize(
    ("server", "protocol"),
    [
        ("normserve", "/normalize JSON"),
        ("normserve", "V2 JSON"),
        ("normserve", "V2 binary"),
        ("normserve", "gRPC"),
        ("naive", "/normalize JSON"),
    ],
)
def test_every_http_cell_answered_without_errors(
    report: tuple[Path, dict[str, Any]], server: str, protocol: str
) -> None:
    cells = [r for r in report[1]["http"] if (r["server"], r["protocol"]) == (server, protocol)]
    assert len(cells) == 4  # 2 shapes x 2 concurrencies
    assert all(c["errors"] == 0 and c["requests"] > 0 for c in cells)


@pytest.mark.parametrize(("server", "cells"), [(TRACED, 2), (TRIVIAL, 2), (GRPC_FLOOR, 2)])
def test_the_floors_and_the_tracing_row_answered(report: tuple[Path, dict[str, Any]], server: str, cells: int) -> None:
    rows = [r for r in report[1]["http"] if r["server"] == server]
    assert len(rows) == cells and all(r["errors"] == 0 and r["requests"] > 0 for r in rows)
    assert report[1]["binary_floor"]["p50_ms"] > 0
    assert [tuple(r["shape"]) for r in report[1]["encoder_torch"]] == [(1, 4, 128)]


def test_the_fp16_row_runs_at_the_largest_shape_beside_fp32_with_its_target(
    report: tuple[Path, dict[str, Any]],
) -> None:
    cells = [r for r in report[1]["http"] if (r["server"], r["protocol"]) == ("normserve", HALF)]
    assert [(tuple(c["shape"]), c["concurrency"]) for c in cells] == [((2, 4, 32), 1), ((2, 4, 32), 2)]
    assert all(c["errors"] == 0 and c["requests"] > 0 for c in cells)  # each answer checked within 1 FP16 ulp first
    text = (report[0] / "benchmarks.md").read_text()
    for conc in (1, 2):
        assert f"| {HALF} (2, 4, 32) c={conc}: no slower than the FP32 row per byte moved | " in text


def test_the_targets_table_has_a_floor_column(report: tuple[Path, dict[str, Any]]) -> None:
    text = (report[0] / "benchmarks.md").read_text()
    assert "| target | measured | multiple of its floor | verdict |" in text
    assert "server CPU per request <= 6x the trivial ASGI app's" in text  # c=8 rows: "not measured" at c=2
    assert "MLServer V2 JSON | not measured in this run" in text  # a peer left out says so, not a missing row


def test_batching_and_memory_sections_measured_both_settings(report: tuple[Path, dict[str, Any]]) -> None:
    results = report[1]
    assert {(r["batching"], r["concurrency"]) for r in results["batching"]} == {
        ("off", 1),
        ("off", 4),
        ("on", 1),
        ("on", 4),
    }
    assert all(r["errors"] == 0 for r in results["batching"])
    assert [r["protocol"] for r in results["memory"]] == ["/normalize JSON", "V2 binary", "gRPC"]
    assert all(r["peak_rss_bytes"] >= r["idle_rss_bytes"] > 0 for r in results["memory"])


@pytest.mark.parametrize("argv", [["--sections", "floor,nonsense"]])
def test_an_unknown_section_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        suite.main([*argv, "--quick", "--no-kserve"])
    assert e.value.code == 2
    assert "nonsense" in capsys.readouterr().err


def test_the_report_renders_again_from_its_json(report: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out = report[0]
    assert suite.main(["--render", str(out / "benchmarks.json"), "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "benchmarks.md").read_text() == (out / "benchmarks.md").read_text()
    assert (tmp_path / "benchmarks.png").stat().st_size > 1000


@pytest.mark.parametrize("server", ["normserve", TRIVIAL, "naive"])
def test_each_pinned_cell_ran_every_round_with_req_per_second_and_cpu_per_request(
    report: tuple[Path, dict[str, Any]], server: str
) -> None:
    figures = report[1]["pinned"]
    (cell,) = [c for c in figures["cells"] if c["server"] == server]
    assert (tuple(cell["shape"]), cell["concurrency"], cell["protocol"]) == ((1, 8, 64), 8, "/normalize JSON")
    assert len(cell["runs"]) == 2 and cell["errors"] == 0 and cell["requests"] > 0
    assert cell["rps"] > 0 and cell["cpu_ms_per_request"] > 0
    assert figures["server_cpu"] != figures["load_cpu"]


def test_the_headline_and_its_targets_come_from_the_pinned_cells(report: tuple[Path, dict[str, Any]]) -> None:
    text = (report[0] / "benchmarks.md").read_text()
    assert "| case | normserve | trivial ASGI app | naive FastAPI | goal |" in text
    assert "| /normalize JSON (1,8,64) c=8 | " in text
    assert "/normalize JSON (1, 8, 64) c=8 (pinned): server CPU per request <= 6x the trivial ASGI app's | " in text
    assert "/normalize JSON (1, 8, 64) c=8 (pinned): req/s >= 10x naive FastAPI | " in text


def test_the_pinned_worker_was_sampled_after_its_rounds_and_its_miss_links_the_profile(
    report: tuple[Path, dict[str, Any]],
) -> None:
    (profile,) = report[1]["pinned"]["profiles"]
    assert (tuple(profile["shape"]), profile["concurrency"]) == ((1, 8, 64), 8)
    assert "error" not in profile and profile["samples"] > 0, profile
    text = (report[0] / "benchmarks.md").read_text()
    assert "| target | measured | multiple of its floor | verdict | profile |" in text
    # 10x a peer that does a subset of the work on the same server: missed on any machine (benchmarks/notes.md).
    row = "/normalize JSON (1, 8, 64) c=8 (pinned): req/s >= 10x naive FastAPI | "
    assert text.split(row, 1)[1].split("\n", 1)[0].endswith(" | **missed** | [profile](#profile-pinned-1-8-64) |")
    assert "## Profiles of the misses\n" in text and '<a id="profile-pinned-1-8-64"></a>' in text


def test_the_stage_v2_and_idle_memory_profiles_were_measured(report: tuple[Path, dict[str, Any]]) -> None:
    measured = report[1]["profiles"]
    assert [tuple(r["shape"]) for r in measured["stages"]] == [(1, 8, 64), (2, 4, 32)]
    assert [(r["protocol"], r["requests"]) for r in measured["v2_stages"]] == [("V2 binary", 5), (HALF, 5)]
    assert list(measured["idle_rss"]) == ["interpreter", "serving modules imported", "default models loaded"]
