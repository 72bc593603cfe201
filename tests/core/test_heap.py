"""app/core/heap.py: a warm-up's memory given back, a request's kept: resident memory and page faults measured
in a process of its own.

Each case runs in a fresh interpreter, so what other tests allocated in this one does not blur the figures."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from app.core import heap
from tests.live_server import MODELS

MIB = 1 << 20
PRELUDE = """
import json, os, sys
import numpy as np
import onnxruntime as ort
def rss():
    return next(int(l.split()[1]) * 1024 for l in open(f"/proc/{os.getpid()}/status") if l.startswith("VmRSS:"))
"""
# The default encoder's longest sequence (512 x 128, 4 heads) takes about 30 MiB of arena (measured).
LONGEST_RUN = """
from app.core import heap
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
x, mask = np.zeros((1, 512, 128), np.float32), np.zeros((1, 512), bool)
session.run(["output"], {"input": x[:, :8], "padding_mask": mask[:, :8]})  # the arena's first chunk
before = rss()
session.run(["output"], {"input": x, "padding_mask": mask}, heap.shrinking_run() if sys.argv[2] == "1" else None)
print(json.dumps(rss() - before))
"""
LOAD = """
from app.core.runtime import Runtime
from app.settings import Settings
before = rss()
Runtime(Settings(model_dir=sys.argv[1])).load()
print(json.dumps(rss() - before))
"""


def _measure(script: str, *args: str, env: dict[str, str] | None = None) -> int:
    code = textwrap.dedent(PRELUDE) + textwrap.dedent(script)
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_trim_reaches_glibc_malloc_trim() -> None:
    assert heap.trim() is True


def test_a_shrinking_run_leaves_the_arena_as_it_found_it() -> None:
    model = str(MODELS / "encoder" / "1" / "model.onnx")
    env = {
        "MALLOC_TRIM_THRESHOLD_": "0",
        "PATH": "/usr/bin:/bin",
    }  # glibc gives freed pages back at once: the arena alone
    kept = _measure(LONGEST_RUN, model, "0", env=env)
    shrunk = _measure(LONGEST_RUN, model, "1", env=env)
    assert kept > 20 * MIB, f"the long run kept {kept / MIB:.1f} MiB: the case no longer exercises the arena"
    assert shrunk < 5 * MIB, f"a shrinking run kept {shrunk / MIB:.1f} MiB"


def test_loading_the_default_models_keeps_little_of_their_warm_ups() -> None:
    # Before heap.py, loading the three default models added 88 MiB of resident memory (about 60 of it their
    # warm-ups' arena and freed heap); with it, 28 MiB (measured, AMD EPYC).
    grown = _measure(LOAD, str(MODELS))
    assert grown < 50 * MIB, f"loading the default models added {grown / MIB:.1f} MiB of resident memory"


# A request's arrays: eight of 1 MiB, written, then freed together, as the FP16 path's (no chunk freed on its
# own as large as them all). Prints the median minor page faults per request after two to settle.
REQUESTS = """
import resource, statistics
from app.core import heap
if sys.argv[1] == "1":
    assert heap.raise_thresholds()
def request() -> None:
    arrays = [np.ones(1 << 17) for _ in range(8)]
faults = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    request()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(statistics.median(faults[2:])))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
@pytest.mark.parametrize(
    ("raised", "faults"),
    [("0", range(1024, 4096)), ("1", range(64))],  # 8 MiB is 2,048 pages of 4 KiB
    ids=["glibc-trims-the-heap-after-each-request", "raised-thresholds-keep-it-for-the-next"],
)
def test_raised_thresholds_keep_a_request_s_freed_arrays_for_the_next_one(raised: str, faults: range) -> None:
    assert _measure(REQUESTS, raised) in faults
