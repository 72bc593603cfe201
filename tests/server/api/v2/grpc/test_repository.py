"""The repository RPCs over gRPC (tritonclient.grpc): the same control, token and errors as HTTP's routes."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from tests.repositories import copy_models, learned_layernorm
from tests.server.api.v2.grpc.live import GrpcServer, grpc_server
from tests.triton_clients import TritonOn

TOKEN = "grpc-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
TRITON = TritonOn("live", "grpc")  # tests/conftest.py's `triton`, on this module's server


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    tmp = tmp_path_factory.mktemp("grpc-repo")
    root = copy_models(tmp / "models", ("layernorm",))
    learned_layernorm(root, "my-ln", 1, np.full(3, 2.0), np.zeros(3))
    learned_layernorm(root, "stats-ln", 1, np.ones(3), np.zeros(3))  # loaded by one test alone: fresh statistics
    env = {
        "NORMSERVE_MODEL_DIR": str(root),
        "NORMSERVE_MODEL_CONTROL": "explicit",
        "NORMSERVE_STARTUP_MODELS": "layernorm",
        "NORMSERVE_ADMIN_TOKEN": TOKEN,
    }
    with grpc_server(tmp, env) as server:
        yield server


def _index(triton: tg.InferenceServerClient) -> list[tuple[str, str, str]]:
    index = triton.get_model_repository_index(headers=AUTH, as_json=True)
    return [(m["name"], m["version"], m["state"]) for m in index["models"]]


def test_load_and_unload_change_what_serves(triton: tg.InferenceServerClient) -> None:
    assert _index(triton)[:2] == [("layernorm", "1", "READY"), ("my-ln", "1", "UNAVAILABLE")]
    triton.load_model("my-ln", headers=AUTH)
    assert triton.is_model_ready("my-ln", "1") and _index(triton)[1] == ("my-ln", "1", "READY")
    x = np.array([[1.0, 2.0, 4.0]], np.float32)
    inp = tg.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out = triton.infer("my-ln", [inp]).as_numpy("output")
    np.testing.assert_allclose(out, 2 * (x - x.mean()) / np.sqrt(x.var() + 1e-5), atol=1e-5)  # its own gamma
    triton.unload_model("my-ln", headers=AUTH)
    assert _index(triton)[1] == ("my-ln", "1", "UNAVAILABLE")
    assert triton.is_model_ready("my-ln") is False  # as Triton: ready false, not an error


def _stats(triton: tg.InferenceServerClient, model: str) -> tuple[int, int, list[tuple[int, int]]]:
    """(inference_count, execution_count, [(batch_size, runs)]) of one model."""
    s = triton.get_inference_statistics(model).model_stats[0]
    return s.inference_count, s.execution_count, [(b.batch_size, b.compute_infer.count) for b in s.batch_stats]


def test_the_warm_up_of_a_load_is_no_execution_and_every_run_is_of_batch_size_one(
    triton: tg.InferenceServerClient,
) -> None:
    """Triton's config says max_batch_size 0: every execution is of batch size 1, whatever the input's rows."""
    triton.load_model("stats-ln", headers=AUTH)
    try:
        assert _stats(triton, "stats-ln") == (0, 0, [])  # the parity warm-up ran, and shows nowhere
        for rows in (5, 1, 3):
            x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
            inp = tg.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            triton.infer("stats-ln", [inp])
        assert _stats(triton, "stats-ln") == (3, 3, [(1, 3)])
    finally:
        triton.unload_model("stats-ln", headers=AUTH)


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        (
            None,
            "StatusCode.UNAUTHENTICATED",
            "authorization: expected `Authorization: Bearer <token>` (NORMSERVE_ADMIN_TOKEN is set)",
        ),
        ({"authorization": "Bearer nope"}, "StatusCode.PERMISSION_DENIED", "authorization: wrong admin token"),
    ],
)
@pytest.mark.parametrize("rpc", ["index", "load", "unload"])
def test_the_token_guards_every_repository_rpc(
    triton: tg.InferenceServerClient, rpc: str, headers: dict[str, str] | None, status: str, message: str
) -> None:
    calls = {
        "index": lambda: triton.get_model_repository_index(headers=headers),
        "load": lambda: triton.load_model("layernorm", headers=headers),
        "unload": lambda: triton.unload_model("layernorm", headers=headers),
    }
    with pytest.raises(InferenceServerException) as e:
        calls[rpc]()
    assert (e.value.status(), e.value.message()) == (status, message)


@pytest.mark.parametrize(
    ("name", "status", "message"),
    [
        (
            "nope",
            "StatusCode.NOT_FOUND",
            "model: no model 'nope' in the repository; available: layernorm, my-ln, stats-ln",
        ),
        (
            "../etc",
            "StatusCode.INVALID_ARGUMENT",
            "model_name: expected a model name matching [A-Za-z0-9][A-Za-z0-9_.-]{0,63}, got '../etc'",
        ),
    ],
)
def test_a_load_of_a_name_the_repository_lacks_is_refused(
    triton: tg.InferenceServerClient, name: str, status: str, message: str
) -> None:
    with pytest.raises(InferenceServerException) as e:
        triton.load_model(name, headers=AUTH)
    assert (e.value.status(), e.value.message()) == (status, message)


def test_a_load_with_a_config_override_is_refused(triton: tg.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as e:
        triton.load_model("layernorm", headers=AUTH, config='{"max_batch_size": 8}')
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.value.message() == "parameters.config: not supported; the repository folder is what loads"
