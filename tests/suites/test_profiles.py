"""benchmarks/profiles.py: py-spy's raw stacks summarized per layer, py-spy on a real worker, the V2 stages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks/ lives beside app/ in the checkout

from benchmarks import profiles, servers  # noqa: E402
from benchmarks.inprocess import sample  # noqa: E402
from benchmarks.serving import HALF, make_request  # noqa: E402

LOOP = "<module> (uvicorn/__main__.py:4);Server.run (uvicorn/server.py:86);Runner.run (asyncio/runners.py:118)"
SERVE = f"{LOOP};DataPlane.infer (app/server/dataplane.py:104)"
# A worker's py-spy output in its raw format: a stack (root first) and its sample count per line.
RAW = "\n".join(
    [
        f"{LOOP};_run_once (asyncio/base_events.py:1999) 6",
        f"{LOOP};Budget.receiving (app/server/http/budget.py:155);Timeout.__aexit__ (asyncio/timeouts.py:119) 2",
        f"{LOOP};Budget.receiving (app/server/http/budget.py:150) 2",
        f"{SERVE};NormalizeCodec.decode (app/server/api/rest/codec.py:90);parse (app/core/jsontensors.py:50) 3",
        f"{SERVE};NormalizeCodec.decode (app/server/api/rest/codec.py:95) 1",
        f"{SERVE};normalize (app/core/layernorm.py:231);run_kernel (app/core/kernels.py:84) 5",
        f"{SERVE};moments (app/core/conditioning.py:95);_sum (numpy/_core/_methods.py:52) 3",
        f"{SERVE};NormalizeCodec.encode (app/server/api/rest/codec.py:184) 4",
        f"{SERVE};Record.observe (app/server/telemetry/record.py:60);inc (prometheus_client/metrics.py:300) 2",
        "main (threading.py:1000) 2",
        "",
        "a line without a count",
    ]
)


@pytest.mark.parametrize(
    ("stack", "layer"),
    [
        (["f (uvicorn/protocols/http/httptools_impl.py:1)"], "uvicorn/asyncio"),
        (["serve (app/server/worker.py:1)", "wait (asyncio/locks.py:2)"], "uvicorn/asyncio"),
        (["wait (asyncio/locks.py:2)", "serve (app/server/http/hotpath.py:1)"], "hot path and middleware"),
        (["serve (app/server/worker.py:1)", "parse (app/core/jsontensors.py:9)"], "decode"),
        (["V2Codec.decode (app/server/api/v2/http/codec.py:9)"], "decode"),
        (["V2Codec.encode (app/server/api/v2/http/codec.py:9)"], "encode/response"),
        (["append_raw (app/server/api/v2/grpc/wire.py:9)"], "encode/response"),
        (
            ["decode_normalize (app/server/api/rest/codec.py:9)", "_Scan.release (app/server/api/rest/codec.py:2)"],
            "decode",
        ),
        (
            ["encode_normalize (app/server/api/rest/codec.py:9)", "shaped (app/server/api/rest/codec.py:2)"],
            "encode/response",
        ),
        (["decode_encode (app/server/api/rest/codec.py:9)"], "decode"),
        (["encode_encode (app/server/api/rest/codec.py:9)"], "encode/response"),
        (
            ["encode (app/server/api/rest/codec.py:9)", "normalize (app/core/layernorm.py:1)", "f (numpy/x.py:1)"],
            "compute",
        ),
        (["run (onnxruntime/capi/session.py:220)"], "compute"),
        (["dumps (app/core/tensors.py:9)"], "encode/response"),
        (["observe (app/server/telemetry/metrics.py:9)"], "metrics/logging/tracing"),
        (["emit (logging/__init__.py:9)"], "metrics/logging/tracing"),
        (["main (threading.py:9)", "f (numpy/x.py:1)"], "other"),
    ],
)
def test_a_stack_counts_for_the_layer_of_its_innermost_known_frame(stack: list[str], layer: str) -> None:
    assert profiles.layer_of(stack) == layer


def test_the_summary_gives_each_layers_share_of_the_samples_in_the_report_order() -> None:
    summary = profiles.summarize(RAW)
    assert summary["samples"] == 30
    assert summary["layers"] == {
        "uvicorn/asyncio": 8 / 30,
        "hot path and middleware": 2 / 30,
        "decode": 4 / 30,
        "compute": 8 / 30,
        "encode/response": 4 / 30,
        "metrics/logging/tracing": 2 / 30,
        "other": 2 / 30,
    }
    assert list(summary["layers"]) == profiles.LAYERS


def test_the_summary_ranks_the_top_functions_by_self_time() -> None:
    top = profiles.summarize(RAW)["top"]
    assert top[:4] == [
        ["_run_once (asyncio/base_events.py)", 6 / 30],
        ["run_kernel (app/core/kernels.py)", 5 / 30],
        ["NormalizeCodec.encode (app/server/api/rest/codec.py)", 4 / 30],
        ["parse (app/core/jsontensors.py)", 3 / 30],
    ]
    assert len(top) == profiles.TOP


def test_no_samples_summarize_to_no_layers() -> None:
    assert profiles.summarize("\n") == {"samples": 0, "layers": {}, "top": []}


def test_a_process_py_spy_cannot_sample_gives_the_reason_instead_of_failing() -> None:
    sleeper = subprocess.Popen(["sleep", "60"])  # not a Python: py-spy finds no interpreter to sample
    try:
        with servers.serve("normserve") as srv:
            request = make_request("/normalize JSON", sample((1, 8, 64)))
            summary = profiles.record(sleeper.pid, srv.port, request, 1, 1, 100)
    finally:
        sleeper.kill()
        sleeper.wait(timeout=30)
    assert summary == {
        "error": "py-spy could not sample the worker (exit 1): Failed to find python version from target process"
    }


def test_py_spy_samples_a_real_worker_under_load_mostly_in_normserve_and_uvicorn() -> None:
    with servers.serve("normserve") as srv:
        summary = profiles.record(srv.pid, srv.port, make_request("/normalize JSON", sample((1, 8, 64))), 4, 1, 200)
    assert "error" not in summary, summary
    assert summary["samples"] > 20
    assert abs(sum(summary["layers"].values()) - 1) < 1e-9
    assert summary["layers"].get("other", 0) < 0.5
    assert summary["layers"]["compute"] > 0 and summary["layers"]["decode"] > 0


def test_the_v2_stages_of_fp32_and_fp16_come_from_the_workers_statistics() -> None:
    rows = profiles.v2_stages((2, 4, 32), 5)
    assert [(r["protocol"], r["requests"]) for r in rows] == [("V2 binary", 5), (HALF, 5)]
    for r in rows:
        assert list(r["stage_ms"]) == list(profiles.STAGES)
        assert all(ms >= 0 for ms in r["stage_ms"].values()) and r["stage_ms"]["compute_infer"] > 0
        assert r["server_ms"] >= 0  # the worker's CPU in clock ticks (10 ms): five small requests may read none
