"""Request parameters cost bounded work on HTTP and gRPC alike: their count, the misspelling search, the echo.

100,000 unknown names (4.9 MB) once took 5.4 s of difflib and came back as a 4.1 MB `ignored_parameters`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from app.core import reference
from tests.server.api.v2.grpc.live import GrpcServer

MAX_PARAMETERS, MAX_ECHOED = 64, 16  # as docs/api.md states them

X = [[0.5, -1.0, 2.0], [3.0, 0.25, -0.5]]
LONG = "epsilon" * 30  # 210 characters, starting like a misspelt `eps`: never spell-checked
CUT = LONG[:63] + "…"


def _http(live: GrpcServer, params: dict[str, Any]) -> httpx.Response:
    body = {"inputs": [{"name": "input", "shape": [2, 3], "datatype": "FP32", "data": X}], "parameters": params}
    return httpx.post(f"{live.base}/v2/models/layernorm/infer", json=body, timeout=60)


def _grpc(triton: tg.InferenceServerClient, params: dict[str, Any]) -> Any:
    tensor = tg.InferInput("input", [2, 3], "FP32")
    tensor.set_data_from_numpy(np.array(X, np.float32))
    return triton.infer("layernorm", [tensor], parameters=params)


def _names(count: int, prefix: str = "colour") -> dict[str, Any]:
    return {f"{prefix}{i:06d}": 1 for i in range(count)}


ECHO = ",".join([*sorted(_names(MAX_PARAMETERS))[:MAX_ECHOED], f"+{MAX_PARAMETERS - MAX_ECHOED} more"])


@pytest.mark.parametrize(
    ("params", "echo"),
    [
        (_names(MAX_PARAMETERS), ECHO),
        ({LONG: 1, "eps": 1e-5}, CUT),
        ({"x" * 100_000: "y"}, "x" * 63 + "…"),
    ],
    ids=["64-names-echo-16", "long-name-not-spell-checked", "100k-char-name"],
)
def test_accepted_parameters_are_echoed_bounded_on_both_transports(
    live_grpc: GrpcServer, triton: tg.InferenceServerClient, params: dict[str, Any], echo: str
) -> None:
    r = _http(live_grpc, params)
    assert r.status_code == 200, r.text
    assert r.json()["parameters"] == {"ignored_parameters": echo}
    got = _grpc(triton, params)
    assert got.get_response().parameters["ignored_parameters"].string_param == echo
    want = reference.layer_norm(np.array(X, np.float64), 1, 1e-5, "var").output
    np.testing.assert_allclose(got.as_numpy("output"), want, atol=1e-5)


@pytest.mark.parametrize("count", [MAX_PARAMETERS + 1, 100_000], ids=["65", "100k"])
def test_too_many_parameters_is_a_fast_small_400_naming_parameters(
    live_grpc: GrpcServer, triton: tg.InferenceServerClient, count: int
) -> None:
    message = f"parameters: {count} parameters; at most {MAX_PARAMETERS} are accepted"
    params = _names(count, "epsilon")  # every one close to `eps`: the old spelling check ran on each
    start = time.perf_counter()
    r = _http(live_grpc, params)
    seconds = time.perf_counter() - start
    assert (r.status_code, r.json()) == (400, {"error": message})
    # 25 ms of server CPU in process (docs/reliability.md); the bound leaves room for a loaded 2-core machine
    assert len(r.content) < 200 and seconds < 10.0, (len(r.content), seconds)
    with pytest.raises(InferenceServerException) as e:
        _grpc(triton, params)
    assert (e.value.status(), e.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)


def test_docs_state_the_parameter_limits() -> None:
    api = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    assert (
        f"At most {MAX_PARAMETERS} request parameters are accepted (more is a 400 naming `parameters`); a name "
        f"longer than 64 characters is never taken for a misspelling, and `ignored_parameters` lists at most "
        f"{MAX_ECHOED} names, each cut to 64 characters, then `+N more`."
    ) in api.replace("\n", " ")
