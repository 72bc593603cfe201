"""The repo's exported models/ in onnxruntime against the float64 NumPy reference, fed as the server feeds them;
and the learned LayerNorm's parity check (app/export/parity.py) on the shipped generic graph.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

from app.core import reference
from app.core.reference import EncoderConfig
from app.core.repository import Repository
from app.export.modules import seeded_encoder
from app.export.parity import encoder_parity, learned_layernorm_parity
from tests.export.trained import layer_norm as trained_layer_norm
from tests.live_server import MODELS

LAYERNORM_ATOL = 1e-5  # float32 kernel vs float64 math on unit-scale data
ENCODER_ATOL = 1e-4
ENCODERS = ["encoder", "encoder-preln"]


@pytest.fixture(scope="module")
def shipped_manifest() -> dict[str, Any]:
    """Version 1 of each default model in the repo's models/, as {"models": {name: its manifest.json}}."""
    repo = Repository(MODELS)
    return {"models": {name: repo.manifest(name, 1) for name in repo.names()}}


@pytest.fixture(scope="module")
def sessions(shipped_manifest: dict[str, Any]) -> dict[str, ort.InferenceSession]:
    return {
        name: ort.InferenceSession(str(MODELS / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
        for name in shipped_manifest["models"]
    }


def test_the_repository_holds_version_1_of_the_three_models_and_their_files_match(
    shipped_manifest: dict[str, Any],
) -> None:
    models = shipped_manifest["models"]
    assert sorted(models) == ["encoder", "encoder-preln", "layernorm"]
    for name, entry in models.items():
        folder = MODELS / name / "1"
        assert sorted(p.name for p in folder.iterdir()) == sorted([*entry["files"], "manifest.json"])
        for file, sha256 in entry["files"].items():
            assert hashlib.sha256((folder / file).read_bytes()).hexdigest() == sha256, f"{name}/1/{file} changed"


def _run_layernorm(
    session: ort.InferenceSession,
    x: np.ndarray,
    k: int,
    eps: float | np.ndarray,
    eps_mode: str,
    gamma: np.ndarray | None = None,
    beta: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Reshape to the (rows, cols) view, feed per-row eps, and return output, mean, inv_std_dev as (R,D), (R,1)."""
    rows, cols = math.prod(x.shape[: x.ndim - k]), math.prod(x.shape[x.ndim - k :])
    eps_col = np.broadcast_to(np.asarray(eps, np.float32).reshape(-1, 1), (rows, 1)).copy()
    zero = np.zeros((rows, 1), np.float32)
    feeds = {
        "input": x.astype(np.float32).reshape(rows, cols),
        "gamma": np.ones(cols, np.float32) if gamma is None else gamma.astype(np.float32).reshape(cols),
        "beta": np.zeros(cols, np.float32) if beta is None else beta.astype(np.float32).reshape(cols),
        "eps_var": eps_col if eps_mode == "var" else zero,
        "eps_std": zero if eps_mode == "var" else eps_col,
    }
    outputs: list[np.ndarray] = session.run(None, feeds)
    return outputs


def _inv_std_dev(var: np.ndarray, eps: float | np.ndarray, eps_mode: str) -> np.ndarray:
    return 1.0 / (np.sqrt(var + eps) if eps_mode == "var" else np.sqrt(var) + eps)


@pytest.mark.parametrize("affine", [False, True], ids=["plain", "gamma-beta"])
@pytest.mark.parametrize("eps_mode", ["var", "std"])
@pytest.mark.parametrize(("shape", "k"), [((7,), 1), ((6, 32), 1), ((2, 128), 1), ((3, 4, 8), 2), ((2, 3, 4, 5), 3)])
def test_layernorm_matches_reference(
    sessions: dict[str, ort.InferenceSession], shape: tuple[int, ...], k: int, eps_mode: str, affine: bool
) -> None:
    rng = np.random.default_rng(len(shape) * 10 + k)
    x = rng.standard_normal(shape).astype(np.float32)
    gamma, beta = (rng.uniform(0.5, 1.5, shape[-k:]), rng.standard_normal(shape[-k:])) if affine else (None, None)
    out, mean, inv_std_dev = _run_layernorm(sessions["layernorm"], x, k, 1e-5, eps_mode, gamma, beta)
    r = reference.layer_norm(x, k, 1e-5, eps_mode, gamma, beta)
    np.testing.assert_allclose(out.reshape(shape), r.output, atol=LAYERNORM_ATOL)
    np.testing.assert_allclose(mean.reshape(r.mean.shape), r.mean, atol=LAYERNORM_ATOL)
    np.testing.assert_allclose(
        inv_std_dev.reshape(r.var.shape), _inv_std_dev(r.var, 1e-5, eps_mode), atol=LAYERNORM_ATOL
    )


@pytest.mark.parametrize("eps_mode", ["var", "std"])
def test_layernorm_per_row_eps_matches_reference_row_by_row(
    sessions: dict[str, ort.InferenceSession], eps_mode: str
) -> None:
    x = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32) * 0.1
    eps = np.array([1e-6, 1e-5, 1e-3, 1e-1, 1.0])
    out, _, inv_std_dev = _run_layernorm(sessions["layernorm"], x, 1, eps, eps_mode)
    for i, e in enumerate(eps):
        r = reference.layer_norm(x[i], 1, float(e), eps_mode)
        np.testing.assert_allclose(out[i], r.output, atol=LAYERNORM_ATOL, err_msg=f"row {i}, eps {e}")
        np.testing.assert_allclose(inv_std_dev[i, 0], _inv_std_dev(r.var, e, eps_mode), rtol=1e-6)


@pytest.mark.parametrize("eps_mode", ["var", "std"])
def test_layernorm_is_exactly_invariant_to_power_of_two_row_scaling(
    sessions: dict[str, ort.InferenceSession], eps_mode: str
) -> None:
    # What the server relies on: rows scaled by 2**-e with eps scaled alike (2**-2e under the root) give
    # bit-identical outputs, so it can bring any finite row into float32's comfortable range.
    x = np.random.default_rng(2).standard_normal((4, 24)).astype(np.float32)
    e = np.array([-20, -3, 5, 40])
    eps = np.ldexp(1e-5, -2 * e if eps_mode == "var" else -e)
    scaled, _, _ = _run_layernorm(sessions["layernorm"], np.ldexp(x, -e[:, None]).astype(np.float32), 1, eps, eps_mode)
    unscaled, _, _ = _run_layernorm(sessions["layernorm"], x, 1, np.float32(1e-5), eps_mode)
    np.testing.assert_array_equal(scaled, unscaled)


def _padding_mask(batch: int, seq: int, padding: str) -> np.ndarray:
    mask = np.zeros((batch, seq), dtype=bool)
    if padding == "trailing":
        mask[0, seq // 2 + 1 :] = True
        mask[-1, seq - seq // 3 :] = True
    elif padding == "fully-padded-row":
        mask[0, seq // 2 + 1 :] = True
        mask[-1] = True  # every key masked: uniform attention, still finite
    return mask


@pytest.mark.parametrize("padding", ["none", "trailing", "fully-padded-row"])
@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (2, 5), (3, 64), (1, 512)])
@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_matches_reference(
    shipped_manifest: dict[str, Any],
    sessions: dict[str, ort.InferenceSession],
    name: str,
    batch: int,
    seq: int,
    padding: str,
) -> None:
    entry = shipped_manifest["models"][name]
    cfg = EncoderConfig(**entry["config"])
    with np.load(MODELS / name / "1" / "weights.npz", allow_pickle=False) as npz:
        weights = {key: npz[key] for key in npz.files}
    x = np.random.default_rng(batch * 1000 + seq).standard_normal((batch, seq, cfg.d_model)).astype(np.float32)
    mask = _padding_mask(batch, seq, padding)
    output, *stats = sessions[name].run(None, {"input": x, "padding_mask": mask})
    expected, expected_stats = reference.encoder(x, weights, cfg, mask)
    assert all(np.isfinite(o).all() for o in [output, *stats])
    np.testing.assert_allclose(output, expected, atol=ENCODER_ATOL)
    for (norm, mean, std), got_mean, got_std in zip(expected_stats, stats[::2], stats[1::2], strict=True):
        np.testing.assert_allclose(got_mean, mean, atol=ENCODER_ATOL, err_msg=f"{norm}.mean")
        np.testing.assert_allclose(got_std, std, atol=ENCODER_ATOL, err_msg=f"{norm}.std")


@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_outputs_are_named_after_its_layer_norms_in_execution_order(
    shipped_manifest: dict[str, Any], sessions: dict[str, ort.InferenceSession], name: str
) -> None:
    entry = shipped_manifest["models"][name]
    norms = reference.layer_norm_names(EncoderConfig(**entry["config"]))
    assert entry["layer_norms"] == norms
    assert norms[-1] == ("norm" if name == "encoder-preln" else "layers.1.norm2")
    expected = ["output"] + [f"{n}.{s}" for n in norms for s in ("mean", "std")]
    assert [o.name for o in sessions[name].get_outputs()] == expected
    assert [i.name for i in sessions[name].get_inputs()] == ["input", "padding_mask"]


def test_learned_layernorm_parity_feeds_the_checkpoints_gamma_beta_and_eps(
    sessions: dict[str, ort.InferenceSession],
) -> None:
    module = trained_layer_norm((2, 8), eps=1e-3)
    gamma, beta = (p.detach().numpy() for p in (module.weight, module.bias))
    vs_torch, vs_numpy, description = learned_layernorm_parity(sessions["layernorm"], module, gamma, beta)
    assert vs_torch <= ENCODER_ATOL and vs_numpy <= ENCODER_ATOL
    assert description == (
        "the LayerNorm's gamma and beta (1 and 0 where it has none) and eps 0.001 (eps_mode var); seeded N(0,1) "
        "float32 scaled by 1, 10 and 0.1: [5,2,8], [2,3,2,8], [1,2,8]; the torch.nn.LayerNorm module for the output"
    )
    # gamma fed to the graph but not the module's: the torch figure shows it, the reference follows the feeds.
    vs_torch, vs_numpy, _ = learned_layernorm_parity(sessions["layernorm"], module, gamma + 0.5, beta)
    assert vs_torch > 0.1 and vs_numpy <= ENCODER_ATOL


@pytest.mark.parametrize(("where", "moved"), [("padded", False), ("unpadded", True)])
def test_parity_against_a_module_compares_its_unpadded_positions(
    sessions: dict[str, ort.InferenceSession], where: str, moved: bool
) -> None:
    """A user's module is the truth at unpadded positions; what it answers at padded ones (torch's fast path: 0)
    does not count."""
    model = seeded_encoder(EncoderConfig(), 0)  # the committed encoder's weights
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}

    def module(x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        with torch.no_grad():
            padding = np.zeros(x.shape[:2], dtype=bool) if mask is None else mask
            out = model(torch.from_numpy(x), torch.from_numpy(padding))[0].numpy()
        changed = padding if where == "padded" else ~padding
        return np.where(changed[..., None], out + 1.0, out)

    vs_module, vs_numpy, description = encoder_parity(sessions["encoder"], model, weights, module)
    assert (vs_module > 0.5) is moved and vs_numpy <= ENCODER_ATOL
    assert description.endswith(
        "torch: the module itself in eval mode at unpadded positions, with these masks and with none"
    )
