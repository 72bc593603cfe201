"""KServe's own Python client, InferenceRESTClient with protocol v2 (kserve 0.21, in the test extra), against a
live server: JSON and binary infers (it sends a top-level model_name, and tensor content types), readiness."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from app.core import reference
from tests.live_server import ROOT

# kserve_rest_client's input; not imported from it: importing kserve here would clash with tritonclient's protobufs.
X23 = np.array([[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]], np.float32)


def test_kserve_rest_client_infers_and_checks_readiness(server: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tests.server.api.v2.kserve_rest_client", server],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert (got["live"], got["ready"], got["model_ready"], got["unknown_model_ready"]) == (True, True, True, False)
    ref = reference.layer_norm(X23, 1, 1e-5, "std")
    for way in ("json", "binary"):
        answer = got[way]
        assert (answer["id"], answer["model_name"]) == (f"kserve-{way == 'binary'}", "layernorm")
        np.testing.assert_allclose(answer["outputs"]["output"], ref.output, atol=2e-6)
        np.testing.assert_allclose(answer["outputs"]["mean"], ref.mean, rtol=1e-6)
        np.testing.assert_allclose(answer["outputs"]["inv_std_dev"], 1 / (np.sqrt(ref.var) + 1e-5), rtol=1e-6)
