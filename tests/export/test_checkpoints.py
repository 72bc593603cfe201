"""app/export/checkpoints.py: users' checkpoints read, sized, mapped onto normserve's Encoder, and refused whole."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from app.core.reference import EncoderConfig
from app.export.checkpoints import infer_config, is_torch_encoder, load_encoder, load_layernorm, torch_name
from app.export.modules import CheckpointError, seeded_encoder
from tests.export.trained import USER_ENCODERS, UserEncoder, layer_norm, save, torch_encode

FIT = "check --d-model, --d-ff, --num-layers and the norm placement"


@pytest.fixture(scope="module", params=USER_ENCODERS, ids=lambda u: u.id)
def user(request: pytest.FixtureRequest) -> tuple[UserEncoder, nn.TransformerEncoder]:
    return request.param, request.param.build()


def _given(cfg: EncoderConfig) -> dict[str, object]:
    return {"num_heads": cfg.num_heads, "max_sequence_length": cfg.max_sequence_length}


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ("layers.0.attn.qkv.weight", "layers.0.self_attn.in_proj_weight"),
        ("layers.2.attn.qkv.bias", "layers.2.self_attn.in_proj_bias"),
        ("layers.1.attn.proj.weight", "layers.1.self_attn.out_proj.weight"),
        ("layers.0.ff.fc1.bias", "layers.0.linear1.bias"),
        ("layers.11.ff.fc2.weight", "layers.11.linear2.weight"),
        ("layers.0.norm2.weight", "layers.0.norm2.weight"),
        ("norm.bias", "norm.bias"),
    ],
)
def test_normserve_keys_are_named_as_torch_names_them(ours: str, theirs: str) -> None:
    assert torch_name(ours) == theirs


def test_a_torch_encoder_is_told_from_a_normserve_one(user: tuple[UserEncoder, nn.TransformerEncoder]) -> None:
    spec, model = user
    assert is_torch_encoder(model.state_dict())
    assert not is_torch_encoder(seeded_encoder(dataclasses.replace(spec.cfg, max_sequence_length=8)).state_dict())


def test_sizes_and_norm_placement_are_read_from_the_checkpoint(user: tuple[UserEncoder, nn.TransformerEncoder]) -> None:
    spec, model = user
    assert infer_config(model.state_dict(), _given(spec.cfg), torch_format=True) == spec.cfg


def test_a_normserve_checkpoint_is_sized_the_same_way() -> None:
    cfg = EncoderConfig(d_model=24, num_heads=3, d_ff=40, num_layers=2, max_sequence_length=16, norm_first=True)
    expected = dataclasses.replace(cfg, final_norm=True)  # sinusoidal: normserve's own encoder adds it
    assert infer_config(seeded_encoder(cfg).state_dict(), _given(cfg), torch_format=False) == expected


def test_flags_win_over_the_checkpoint(user: tuple[UserEncoder, nn.TransformerEncoder]) -> None:
    spec, model = user
    given = {**_given(spec.cfg), "d_model": 8, "norm_first": not spec.cfg.norm_first, "eps": 1e-6, "d_ff": None}
    expected = dataclasses.replace(spec.cfg, d_model=8, norm_first=not spec.cfg.norm_first, eps=1e-6)
    assert infer_config(model.state_dict(), given, torch_format=True) == expected


def test_the_loaded_encoder_computes_what_torch_does(
    user: tuple[UserEncoder, nn.TransformerEncoder], tmp_path: Path
) -> None:
    spec, model = user
    ours = load_encoder(save(model, tmp_path / "user.pt"), _given(spec.cfg))
    assert ours.cfg == spec.cfg and not ours.training
    x = np.random.default_rng(1).standard_normal((2, 9, spec.cfg.d_model)).astype(np.float32)
    mask = np.zeros((2, 9), dtype=bool)
    mask[1, 5:] = True  # padded keys; no row fully padded (torch gives NaN there, normserve a uniform attention)
    with torch.no_grad():
        got = ours(torch.from_numpy(x), torch.from_numpy(mask))[0].numpy()
    np.testing.assert_allclose(got, torch_encode(model, x, mask), atol=1e-5)


def _broken(model: nn.Module, how: str, path: Path) -> Path:
    state = model.state_dict()
    if how == "missing":
        del state["layers.0.linear2.bias"]
    elif how == "misshapen":
        state["layers.0.self_attn.out_proj.weight"] = torch.zeros(3, 5)
    elif how == "not-a-state-dict":
        torch.save([1, 2, 3], path)
        return path
    torch.save(state, path)
    return path


@pytest.mark.parametrize(
    ("how", "problem"),
    [
        ("missing", "missing keys layers.0.linear2.bias"),
        ("misshapen", "shape mismatch: layers.0.self_attn.out_proj.weight [3, 5] != [32, 32]"),
    ],
)
def test_a_checkpoint_that_does_not_fit_is_refused_in_its_own_names(tmp_path: Path, how: str, problem: str) -> None:
    spec = USER_ENCODERS[0]
    path = _broken(spec.build(), how, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError) as e:
        load_encoder(path, _given(spec.cfg))
    described = "the torch.nn.TransformerEncoder that its keys and the flags describe (d_model 32, d_ff 64, 1 layers, "
    assert str(e.value) == f"{path} does not fit {described}no final norm, bias=True) ({problem}); {FIT}"


def test_pre_ln_of_a_stack_without_final_norm_is_built_without_one(tmp_path: Path) -> None:
    spec = USER_ENCODERS[0]  # torch's pre-LN stack with norm=None has exactly these keys
    path = save(spec.build(), tmp_path / "post.pt")
    cfg = load_encoder(path, {**_given(spec.cfg), "norm_first": True}).cfg
    assert (cfg.norm_first, cfg.final_norm, cfg.has_final_norm) == (True, False, False)


@pytest.mark.parametrize(
    ("state", "problem"),
    [
        (
            {"weight": torch.ones(64), "bias": torch.zeros(64)},
            "this is a torch.nn.LayerNorm state_dict (weight [64], bias [64]): `normserve export layernorm` takes it",
        ),
        (
            {"weight": torch.ones(2, 8)},
            "this is a torch.nn.LayerNorm state_dict (weight [2, 8]): `normserve export layernorm` takes it",
        ),
        (
            {"step": torch.zeros(1)},
            "this state_dict is neither a torch.nn.TransformerEncoder's nor a torch.nn.LayerNorm's (keys step)",
        ),
    ],
    ids=["layernorm", "layernorm-bias-false", "neither"],
)
def test_an_encoder_export_of_another_kind_of_state_dict_says_what_it_is(
    tmp_path: Path, state: dict[str, torch.Tensor], problem: str
) -> None:
    path = tmp_path / "other.pt"
    torch.save(state, path)
    with pytest.raises(CheckpointError) as e:
        load_encoder(path, {"num_heads": 4})
    assert str(e.value) == f"{path}: {problem}"


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (
            lambda: USER_ENCODERS[0].build(),
            "this is a torch.nn.TransformerEncoder state_dict (1 layers, d_model 32): `normserve export encoder` takes it",
        ),
        (
            lambda: seeded_encoder(EncoderConfig(d_model=16, num_heads=2, d_ff=8, num_layers=2, max_sequence_length=8)),
            "this is a normserve Encoder state_dict (2 layers, d_model 16): `normserve export encoder` takes it",
        ),
    ],
    ids=["torch", "normserve"],
)
def test_a_layernorm_export_of_an_encoder_state_dict_says_what_it_is(
    tmp_path: Path, build: Callable[[], nn.Module], problem: str
) -> None:
    path = save(build(), tmp_path / "encoder.pt")
    with pytest.raises(CheckpointError) as e:
        load_layernorm(path)
    assert str(e.value) == f"{path}: {problem}"


def test_a_lone_layer_state_dict_is_the_stack_of_one(tmp_path: Path) -> None:
    layer = USER_ENCODERS[0].build().layers[0]
    cfg = load_encoder(save(layer, tmp_path / "layer.pt"), {"num_heads": 4}).cfg
    assert (cfg.num_layers, cfg.d_model, cfg.d_ff, cfg.final_norm) == (1, 32, 64, False)


def test_a_file_that_is_not_a_state_dict_is_refused(tmp_path: Path) -> None:
    path = _broken(nn.Linear(1, 1), "not-a-state-dict", tmp_path / "list.pt")
    with pytest.raises(CheckpointError) as e:
        load_encoder(path, {"num_heads": 4})
    assert str(e.value) == f"{path}: expected a state_dict (a mapping of names to tensors), got a list"


def test_heads_that_do_not_divide_d_model_are_refused(tmp_path: Path) -> None:
    path = save(USER_ENCODERS[0].build(), tmp_path / "user.pt")
    with pytest.raises(ValueError, match=r"^d_model 32 must be even and divisible by num_heads 5$"):
        load_encoder(path, {"num_heads": 5})


@pytest.mark.parametrize("shape", [(16,), (2, 8), (2, 3, 4)], ids=str)
def test_layernorm_weights_are_gamma_and_beta(tmp_path: Path, shape: tuple[int, ...]) -> None:
    module = layer_norm(shape)
    gamma, beta = load_layernorm(save(module, tmp_path / "ln.pt"))
    assert gamma.dtype == beta.dtype == np.float32 and gamma.shape == beta.shape == shape
    np.testing.assert_array_equal(gamma, module.weight.detach().numpy())
    np.testing.assert_array_equal(beta, module.bias.detach().numpy())
    assert np.abs(gamma - 1).max() > 0.05 and np.abs(beta).max() > 0.05, "trained, not torch's 1 and 0"


def test_a_layernorm_without_bias_has_beta_zero(tmp_path: Path) -> None:
    module = nn.LayerNorm((2, 8), bias=False)
    _, beta = load_layernorm(save(module, tmp_path / "ln.pt"))
    np.testing.assert_array_equal(beta, np.zeros((2, 8), np.float32))


@pytest.mark.parametrize(
    ("state", "problem"),
    [
        (
            {},
            "an empty state_dict (torch.nn.LayerNorm(elementwise_affine=False) has no weights); "
            "the default layernorm model serves it, with eps in each request",
        ),
        (
            {"weight": torch.ones(4), "bias": torch.zeros(4), "running_mean": torch.zeros(4)},
            "this state_dict is neither a torch.nn.TransformerEncoder's nor a torch.nn.LayerNorm's "
            "(keys bias, running_mean, weight)",
        ),
        (
            {"bias": torch.zeros(4)},
            "this state_dict is neither a torch.nn.TransformerEncoder's nor a torch.nn.LayerNorm's (keys bias)",
        ),
        (
            {"weight": torch.ones(2, 4), "bias": torch.zeros(8)},
            "shape mismatch: weight [2, 4], bias [8]; expected both of the normalized_shape",
        ),
    ],
    ids=["elementwise-affine-false", "unexpected", "missing-weight", "misshapen"],
)
def test_a_layernorm_checkpoint_that_does_not_fit_is_refused(
    tmp_path: Path, state: dict[str, torch.Tensor], problem: str
) -> None:
    path = tmp_path / "ln.pt"
    torch.save(state, path)
    with pytest.raises(CheckpointError) as e:
        load_layernorm(path)
    assert str(e.value) == f"{path}: {problem}"
