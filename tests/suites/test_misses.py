"""benchmarks/misses.py: the targets table's profile column and the "Profiles of the misses" section it links to."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks/ lives beside app/ in the checkout

from benchmarks import misses  # noqa: E402
from benchmarks.serving import HALF  # noqa: E402

MISSED, MET = "**missed**", "met"
SMALL_CPU = "/normalize JSON (1, 8, 64) c=8 (pinned): server CPU per request <= 6x the trivial ASGI app's"
SMALL_PEER = "/normalize JSON (1, 8, 64) c=8 (pinned): req/s >= 10x naive FastAPI"
LARGE_PEER = "/normalize JSON (8, 128, 768) c=1 (pinned): req/s >= 30x naive FastAPI"
STAGED = "conditioned /normalize path (8, 128, 768) in process: <= 2x torch.nn.functional.layer_norm at 1 thread"
HALF_ROW = f"{HALF} (8, 128, 768) c=1: no slower than the FP32 row per byte moved"
MEMORY = "peak RSS serving a 64 MiB /normalize JSON request <= 4x the body"
ENCODER = "/encode (1, 16, 128) in process: <= 1.5x torch's Encoder (same weights, 1 thread)"
MIB = 2**20

RESULTS: dict[str, Any] = {
    "pinned": {
        "profiles": [
            {
                "shape": [1, 8, 64],
                "concurrency": 8,
                "seconds": 5.0,
                "samples": 1000,
                "layers": {"uvicorn/asyncio": 0.25, "compute": 0.5, "other": 0.25},
                "top": [["run_kernel (app/core/kernels.py)", 0.125], ["_run_once (asyncio/base_events.py)", 0.0625]],
            },
            {"shape": [8, 128, 768], "concurrency": 1, "seconds": 5.0, "error": "py-spy could not sample the worker"},
        ]
    },
    "profiles": {
        "stages": [
            {
                "shape": [8, 128, 768],
                "whole_s": 0.004,
                "stages_s": {"float64 moments": 0.002, "fused kernel run": 0.001, "the rest": 0.001},
            }
        ],
        "v2_stages": [
            {
                "protocol": "V2 binary",
                "shape": [8, 128, 768],
                "requests": 100.0,
                "server_ms": 8.0,
                "stage_ms": {"queue": 0.2, "compute_input": 1.0, "compute_infer": 2.0, "compute_output": 0.5},
            },
            {
                "protocol": HALF,
                "shape": [8, 128, 768],
                "requests": 100.0,
                "server_ms": 7.5,
                "stage_ms": {"queue": 0.2, "compute_input": 0.5, "compute_infer": 3.0, "compute_output": 0.25},
            },
        ],
        "idle_rss": {
            "interpreter": 10 * MIB,
            "serving modules imported": 100 * MIB,
            "default models loaded": 130 * MIB,
        },
    },
    "memory": [
        {
            "protocol": "/normalize JSON",
            "payload_bytes": 64 * MIB,
            "idle_rss_bytes": 192 * MIB,
            "peak_rss_bytes": 448 * MIB,
        }
    ],
}


def _row(target: str, verdict: str) -> list[str]:
    return [target, "measured", "1.00x", verdict]


@pytest.mark.parametrize(
    ("target", "verdict", "profile"),
    [
        (SMALL_CPU, MISSED, "[profile](#profile-pinned-1-8-64)"),
        (SMALL_PEER, MISSED, "[profile](#profile-pinned-1-8-64)"),
        (SMALL_PEER, MET, "-"),
        (LARGE_PEER, MISSED, "[profile](#profile-pinned-8-128-768)"),
        (STAGED, MISSED, "[profile](#profile-stages-8-128-768)"),
        (HALF_ROW, MISSED, "[profile](#profile-v2-stages)"),
        ("V2 binary (8, 128, 768) c=1 over HTTP: p50 <= 3x its floor", MISSED, "[profile](#profile-v2-stages)"),
        ("V2 binary (8, 128, 768) c=1 over gRPC: p50 <= 2x its floor", MISSED, "not profiled"),
        (MEMORY, MISSED, "[profile](#profile-memory)"),
        (MEMORY, MET, "-"),
        (ENCODER, MISSED, "not profiled"),
        ("statistics outputs (8, 128, 768): <= 10% over output only", MISSED, "[profile](#profile-stages-8-128-768)"),
        ("statistics outputs (1, 8, 64): <= 10% over output only", MISSED, "not profiled"),
        (
            "conditioned /normalize path (1, 8, 64) in process: <= 2x a plain onnxruntime session call",
            MISSED,
            "not profiled",
        ),
    ],
)
def test_a_missed_row_links_to_its_profile_and_a_met_row_to_none(target: str, verdict: str, profile: str) -> None:
    rows, _ = misses.linked(RESULTS, [_row(target, verdict)])
    assert rows == [[*_row(target, verdict), profile]]


def test_the_section_holds_each_linked_profile_once_in_the_tables_order() -> None:
    _, anchors = misses.linked(RESULTS, [_row(t, MISSED) for t in (MEMORY, SMALL_CPU, SMALL_PEER, HALF_ROW)])
    assert anchors == ["profile-memory", "profile-pinned-1-8-64", "profile-v2-stages"]
    text = "\n".join(misses.section(RESULTS, anchors))
    assert text.startswith(misses.HEADING)
    assert [text.index(f'<a id="{a}"></a>') for a in anchors] == sorted(
        text.index(f'<a id="{a}"></a>') for a in anchors
    )


def test_no_missed_row_no_section() -> None:
    rows, anchors = misses.linked(RESULTS, [_row(SMALL_CPU, MET)])
    assert anchors == [] and misses.section(RESULTS, anchors) == []


def _rendered(anchor: str, results: dict[str, Any] = RESULTS) -> str:
    return "\n".join(misses.section(results, [anchor]))


def test_the_pinned_profile_shows_the_share_per_layer_and_the_top_functions() -> None:
    text = _rendered("profile-pinned-1-8-64")
    assert "### /normalize JSON (1,8,64) c=8: the pinned worker\n" in text
    assert "py-spy at 200 Hz for 5 s on the pinned normserve worker" in text and ": 1000 samples of" in text
    assert "| uvicorn/asyncio | 25% |\n| compute | 50% |\n| other | 25% |" in text
    assert "| `run_kernel (app/core/kernels.py)` | 12.5% |\n| `_run_once (asyncio/base_events.py)` | 6.2% |" in text


def test_a_profile_py_spy_could_not_take_says_why() -> None:
    text = _rendered("profile-pinned-8-128-768")
    assert (
        "### /normalize JSON (8,128,768) c=1: the pinned worker\n\nNo profile: py-spy could not sample the worker.\n"
        in text
    )


def test_the_stage_profile_gives_each_stages_median_and_share_of_the_whole_call() -> None:
    text = _rendered("profile-stages-8-128-768")
    assert "The whole call (`model.infer` on the data plane's input, gamma 1, beta 0, eps 1e-5): 4 ms, median." in text
    assert "| float64 moments | 2 | 50% |\n| fused kernel run | 1 | 25% |\n| the rest | 1 | 25% |" in text


def test_the_v2_stages_put_fp16_beside_fp32_with_their_ratio() -> None:
    text = _rendered("profile-v2-stages")
    assert "read before and after 100 sequential requests of each" in text
    rows = "| queue | 0.2 | 0.2 | 1.00 |\n| compute_input | 1 | 0.5 | 0.50 |\n| compute_infer | 2 | 3 | 1.50 |\n"
    rows += "| compute_output | 0.5 | 0.25 | 0.50 |\n| outside the stages (HTTP, transport, middleware) | 4.3 | 3.55 | 0.83 |\n"
    assert rows + "| the whole request (the worker's CPU) | 8 | 7.5 | 0.94 |" in text


@pytest.mark.parametrize(
    ("fp16_server_ms", "verdict"),
    [
        (
            7.5,
            "The FP16 request without its compute_infer costs 4.5 ms, more than that already: no FP16 compute, "
            "however fast, meets the row.",
        ),
        (
            6.5,
            "The FP16 request without its compute_infer costs 3.5 ms, within it: a compute_infer of at most "
            "0.5 ms would meet the row.",
        ),
    ],
)
def test_the_v2_stages_say_what_per_byte_parity_leaves_fp16s_compute(fp16_server_ms: float, verdict: str) -> None:
    results = copy.deepcopy(RESULTS)
    results["profiles"]["v2_stages"][1]["server_ms"] = fp16_server_ms
    text = _rendered("profile-v2-stages", results)
    assert "an FP16 request costs at most half an FP32 one: 4 ms of the worker's CPU. " + verdict in text


def test_v2_stages_measured_before_the_worker_cpu_was_read_render_without_it() -> None:
    results = copy.deepcopy(RESULTS)
    for r in results["profiles"]["v2_stages"]:
        del r["server_ms"]
    text = _rendered("profile-v2-stages", results)
    assert text.endswith("| compute_output | 0.5 | 0.25 | 0.50 |\n")
    assert "outside the stages" not in text and "the worker's CPU" not in text


def test_the_memory_profile_separates_the_idle_worker_the_body_and_the_peak_above_idle() -> None:
    text = _rendered("profile-memory")
    assert "| /normalize JSON | 64.0 | 192 | 256 | 4.00x |" in text
    steps = (
        "| interpreter | 10 | +10 |\n| serving modules imported | 100 | +90 |\n| default models loaded | 130 | +30 |\n"
    )
    assert steps + "| the idle worker (uvicorn, warm-up, a first request) | 192 | +62 |" in text
