"""gRPC load: 30 s at concurrency 16 of mixed valid and invalid ModelInfer calls; no wrong answer, no INTERNAL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.core.runtime import Runtime
from tests.grpc_loadgen import GrpcOutcome, mixed_cases, run_load
from tests.loadgen import Tally
from tests.server.api.v2.grpc.live import grpc_server

SECONDS = 30.0
CONCURRENCY = 16
MAX_REQUESTS = 1_000_000  # a bound in count as well as in time


@pytest.mark.slow
def test_thirty_seconds_of_mixed_grpc_load_answers_every_call_right(tmp_path: Path, runtime: Runtime) -> None:
    with grpc_server(tmp_path, {"NORMSERVE_LOG_LEVEL": "warning"}) as server:
        tally: Tally[GrpcOutcome] = Tally()
        asyncio.run(run_load(server.address, mixed_cases(runtime), CONCURRENCY, SECONDS, MAX_REQUESTS, tally))
        assert server.proc.poll() is None, "the server died under load"
    summary = tally.summary()
    span = max(o.done for o in tally.outcomes) - min(o.sent for o in tally.outcomes)
    print(f"\ngRPC load: {summary} in {span:.1f} s, {summary['sent'] / span:.0f} calls/s")
    assert span >= SECONDS - 2, "the load ended early"
    assert summary["valid"] > 1000 and summary["invalid"] > 300, summary
    assert summary["internal_or_unknown"] == 0
    assert tally.failures(valid=True) == [], tally.failures(valid=True)[:5]
    assert tally.failures(valid=False) == [], tally.failures(valid=False)[:5]
