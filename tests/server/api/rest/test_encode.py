"""POST /encode over real HTTP: both encoders against the NumPy reference, with padding masks."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from app.core import reference
from app.core.runtime import Runtime


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
