"""app/server/api/rest/routes.py over real HTTP: POST /normalize (golden vectors, backends, validation, shapes, gamma
and beta) and POST /encode (both encoders against the NumPy reference, with padding masks)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.core import reference
from app.core.runtime import Runtime
from app.core.seeds import LAYER_NORM_EXAMPLES, SEED003, LayerNormExample
from tests.live_server import MODELS, live_server
from tests.repositories import add_version, copy_models, learned_layernorm, sha256sum_identity

ATOL = 1e-4  # the float32 service against the seeds' numbers (or their own precision, where coarser)


@pytest.mark.parametrize("backend", ["onnxruntime", "numpy"])
@pytest.mark.parametrize("example", LAYER_NORM_EXAMPLES, ids=lambda e: e.name)
def test_golden_vectors_on_both_backends(client: httpx.Client, backend: str, example: LayerNormExample) -> None:
    r = client.post("/normalize", json={**example.request(), "backend": backend})
    assert r.status_code == 200, r.text
    body = r.json()
    atol = max(ATOL, example.atol)
    np.testing.assert_allclose(body["output"], example.output, atol=atol)
    np.testing.assert_allclose(body["stats"]["mean"], example.mean, atol=atol)
    np.testing.assert_allclose(body["stats"]["std"], example.std, atol=atol)
    np.testing.assert_allclose(np.square(body["stats"]["std"]), body["stats"]["var"], rtol=1e-12)
    assert body["shape"] == list(np.shape(example.x))
    assert body["backend"] == backend


@pytest.mark.parametrize(
    "fields", [{}, {"version": 1}, {"model": "layernorm", "version": "1"}], ids=["default", "int", "str"]
)
def test_onnxruntime_result_names_the_exact_model_version(client: httpx.Client, fields: dict[str, object]) -> None:
    body = client.post("/normalize", json={"data": [[1.0, 2.0]], **fields}).json()
    identity = sha256sum_identity(MODELS / "layernorm/1")
    assert body["model"] == {"name": "layernorm", "version": "1", "sha256": identity}
    assert client.post("/normalize", json={"data": [[1.0, 2.0]], "backend": "numpy", **fields}).json()["model"] is None


def test_versions_that_differ_only_in_weights_answer_with_different_identities(tmp_path: Path) -> None:
    """Trained LayerNorms share the default graph: their identity covers weights.npz too, and is the same for the
    same files (version 3 is a copy of version 1's)."""
    root = copy_models(tmp_path / "models", ("layernorm",))
    learned_layernorm(root, "my-ln", 1, np.array([1.0, 2.0, 3.0]), np.zeros(3))
    learned_layernorm(root, "my-ln", 2, np.array([3.0, 2.0, 1.0]), np.ones(3))
    add_version(root, "my-ln", 3, source=1)
    (root / "my-ln" / "model.json").write_text(json.dumps({"version_policy": {"all": {}}}))
    with live_server({"NORMSERVE_MODEL_DIR": str(root)}) as base:
        answers = [
            httpx.post(f"{base}/normalize", json={"data": [[1.0, 2.0, 4.0]], "model": m, "version": v}, timeout=30)
            for m, v in (("my-ln", 1), ("my-ln", 2), ("my-ln", 3), ("layernorm", 1))
        ]
    assert [r.status_code for r in answers] == [200] * 4
    one, two, copy, default = (r.json()["model"]["sha256"] for r in answers)
    assert [one, two, default] == [
        sha256sum_identity(root / m / v) for m, v in (("my-ln", "1"), ("my-ln", "2"), ("layernorm", "1"))
    ]
    assert len({one, two, default}) == 3 and copy == one
    assert answers[0].json()["output"] != answers[1].json()["output"]  # they compute different things


@pytest.mark.parametrize("backend", ["onnxruntime", "numpy"])
@pytest.mark.parametrize("eps_mode", ["var", "std"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_any_k_eps_mode_gamma_beta_matches_reference(client: httpx.Client, backend: str, eps_mode: str, k: int) -> None:
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((2, 3, 4, 5)) * 2 + 1).astype(np.float32)
    gamma = rng.uniform(0.5, 2, x.shape[-k:]).astype(np.float32)
    beta = rng.standard_normal(x.shape[-k:]).astype(np.float32)
    req = {
        "data": x.tolist(),
        "normalized_shape": list(x.shape[-k:]),
        "eps": 1e-3,
        "eps_mode": eps_mode,
        "gamma": gamma.tolist(),
        "beta": beta.tolist(),
        "backend": backend,
        "validate": True,
    }
    r = client.post("/normalize", json=req)
    assert r.status_code == 200, r.text
    body = r.json()
    ref = reference.layer_norm(x, k, 1e-3, eps_mode, gamma, beta)
    np.testing.assert_allclose(body["output"], ref.output, atol=1e-5 * 2)
    np.testing.assert_allclose(body["stats"]["mean"], ref.mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(body["stats"]["var"], ref.var, rtol=1e-6)
    assert np.shape(body["stats"]["mean"]) == x.shape[: 4 - k]
    v = body["validation"]
    assert v["reference"] == ("numpy" if backend == "onnxruntime" else "onnxruntime")
    assert v["passed"] is True and 0 <= v["max_abs_diff"] <= v["atol"]


def test_normalizing_every_dim_gives_bare_number_stats(client: httpx.Client) -> None:
    body = client.post("/normalize", json={"data": [[1.0, 2.0], [3.0, 4.0]], "normalized_shape": [2, 2]}).json()
    assert body["stats"]["mean"] == pytest.approx(2.5)
    assert body["stats"]["var"] == pytest.approx(1.25)
    np.testing.assert_allclose(body["output"], (np.array([[1, 2], [3, 4]]) - 2.5) / np.sqrt(1.25 + 1e-5), atol=1e-6)


@pytest.mark.parametrize("normalized_shape", [4, [4]], ids=["int", "list"])
def test_normalized_shape_int_or_list(client: httpx.Client, normalized_shape: int | list[int]) -> None:
    r = client.post("/normalize", json={"data": [[1, 2, 3, 4]], "normalized_shape": normalized_shape})
    assert r.status_code == 200
    np.testing.assert_allclose(r.json()["output"], reference.layer_norm(np.array([[1, 2, 3, 4]])).output, atol=1e-6)


@pytest.mark.parametrize(
    ("offset", "scale"),
    [(1e4, 1e-2), (1e8, 1.0), (0.0, 1e30), (1e19, 1e15), (0.0, 1e-30)],
    ids=["offset1e6std", "offset1e8std", "magnitude1e30", "magnitude1e19", "magnitude1e-30"],
)
def test_large_offsets_and_magnitudes_keep_float32_fidelity(client: httpx.Client, offset: float, scale: float) -> None:
    x = (offset + scale * np.random.default_rng(3).standard_normal((4, 64))).astype(np.float32)
    body = client.post("/normalize", json={"data": x.tolist()}).json()
    ref = reference.layer_norm(x, 1)
    np.testing.assert_allclose(body["output"], ref.output, atol=1e-5)
    np.testing.assert_allclose(body["stats"]["var"], ref.var, rtol=1e-6)


def test_constant_rows_normalize_to_beta(client: httpx.Client) -> None:
    body = client.post("/normalize", json={"data": [[3e38] * 4, [-2.0] * 4], "beta": [1, 2, 3, 4]}).json()
    assert body["output"] == [[1, 2, 3, 4], [1, 2, 3, 4]]
    assert body["stats"]["var"] == [0, 0]


def test_gzip_request_body_is_accepted(client: httpx.Client) -> None:
    import gzip

    raw = json.dumps({"data": [SEED003.x[0]]}).encode()
    r = client.post("/normalize", content=gzip.compress(raw), headers={"Content-Encoding": "gzip"})
    assert r.status_code == 200
    np.testing.assert_allclose(r.json()["output"], [SEED003.output[0]], atol=ATOL)


def test_no_content_type_is_fine(client: httpx.Client) -> None:
    r = client.post("/normalize", content=b'{"data": [1, 2]}')
    assert r.status_code == 200


# ---- POST /encode --------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["encoder", "encoder-preln"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_encode_matches_reference(client: httpx.Client, runtime: Runtime, model: str, masked: bool) -> None:
    m = runtime.get(model)
    assert m.config is not None and m.weights is not None
    x = np.random.default_rng(5).standard_normal((2, 6, m.config.d_model)).astype(np.float32)
    mask = np.zeros((2, 6), dtype=bool)
    if masked:
        mask[0, 4:] = True
        mask[1, :] = True  # a fully padded sequence stays finite
    r = client.post(
        "/encode", json={"data": x.tolist(), "padding_mask": mask.tolist(), "model": model, "validate": True}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    ref, stats = reference.encoder(x, m.weights, m.config, mask)
    np.testing.assert_allclose(body["output"], ref, atol=1e-4)
    assert [ln["name"] for ln in body["layer_norms"]] == [s[0] for s in stats] == m.layer_norms
    for ln, (_, mean, std) in zip(body["layer_norms"], stats, strict=True):
        np.testing.assert_allclose(ln["mean"], mean, atol=1e-4)
        np.testing.assert_allclose(ln["std"], std, rtol=1e-4, atol=1e-4)
    assert body["model"]["name"] == model and body["model"]["sha256"] == m.sha256
    assert body["validation"]["passed"] is True and body["validation"]["max_abs_diff"] < 1e-4


def test_preln_stack_ends_with_a_final_norm(client: httpx.Client, runtime: Runtime) -> None:
    d = runtime.get("encoder-preln").config.d_model  # type: ignore[union-attr]
    body = client.post("/encode", json={"data": [[0.0] * d], "model": "encoder-preln"}).json()
    assert body["layer_norms"][-1]["name"] == "norm"
    assert len(body["layer_norms"]) == 2 * runtime.get("encoder-preln").config.num_layers + 1  # type: ignore[union-attr]


def test_two_dim_input_gives_two_dim_output_and_seq_stats(client: httpx.Client, runtime: Runtime) -> None:
    m = runtime.get("encoder")
    x = np.random.default_rng(6).standard_normal((3, m.config.d_model)).astype(np.float32)  # type: ignore[union-attr]
    r = client.post("/encode", json={"data": x.tolist(), "padding_mask": [False, False, True]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert np.shape(body["output"]) == x.shape and body["shape"] == list(x.shape)
    assert all(np.shape(ln["mean"]) == (3,) and np.shape(ln["std"]) == (3,) for ln in body["layer_norms"])
    ref, _ = reference.encoder(x[None], m.weights, m.config, np.array([[False, False, True]]))  # type: ignore[arg-type]
    np.testing.assert_allclose(body["output"], ref[0], atol=1e-4)


def _counts(client: httpx.Client, model: str) -> tuple[int, int, int]:
    (s,) = client.get(f"/v2/models/{model}/stats").json()["model_stats"]
    return s["inference_count"], s["inference_stats"]["success"]["count"], s["inference_stats"]["fail"]["count"]


@pytest.mark.parametrize(
    ("path", "model", "body"),
    [
        ("/normalize", "layernorm", {"data": [[0.2, 0.1, 0.3]]}),
        ("/encode", "encoder", {"data": [[0.1] * 128, [0.2] * 128]}),
    ],
)
def test_rest_inferences_count_in_the_models_triton_statistics(
    client: httpx.Client, path: str, model: str, body: dict[str, object]
) -> None:
    # Triton's statistics count every inference of the model, whatever the protocol it came by.
    before = _counts(client, model)
    for _ in range(3):
        assert client.post(path, json=body).status_code == 200
    assert client.post(path, json={**body, "data": [[1.0, 2.0], [3.0]]}).status_code == 422
    after = _counts(client, model)
    assert [a - b for a, b in zip(after, before, strict=True)] == [3, 3, 1]
