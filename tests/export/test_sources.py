"""app/export/sources.py: whole modules read setting by setting into the twin, and what is not served refused by name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from app.core.reference import EncoderConfig
from app.export.modules import CheckpointError
from app.export.sources import NORM_NOTE, TANH_NOTE, UserEncoder, load_module, user_encoder, user_layernorm


def swish(x: Tensor) -> Tensor:  # a custom activation: module level, so that torch.save can pickle it
    return x * torch.sigmoid(x)


def perturbed(module: nn.Module, seed: int = 0) -> nn.Module:
    """Every weight moved away from torch's init (LayerNorm's 1 and 0 above all), in eval mode."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return module.eval()


def layer(**kw: Any) -> nn.TransformerEncoderLayer:
    return nn.TransformerEncoderLayer(**{"d_model": 16, "nhead": 2, "dim_feedforward": 24, "dropout": 0.0, **kw})


def stack(final: nn.Module | None = None, num_layers: int = 2, **kw: Any) -> nn.TransformerEncoder:
    return nn.TransformerEncoder(layer(batch_first=True, **kw), num_layers, norm=final, enable_nested_tensor=False)


def saved(module: nn.Module, tmp_path: Path) -> Path:
    path = tmp_path / "module.pt"
    torch.save(module, path)
    return path


BASE = {"d_model": 16, "num_heads": 2, "d_ff": 24, "num_layers": 2, "max_sequence_length": 32}


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: stack(), {"positional_encoding": "none", "final_norm": False}),
        (
            lambda: stack(nn.LayerNorm(16, eps=1e-6), nhead=8, activation="gelu", norm_first=True, layer_norm_eps=1e-6),
            {"num_heads": 8, "activation": "gelu", "norm_first": True, "eps": 1e-6, "final_eps": 1e-6},
        ),
        (lambda: stack(activation=nn.GELU(approximate="tanh")), {"activation": "gelu_tanh"}),
        (lambda: stack(activation=nn.ReLU()), {}),
        (lambda: stack(bias=False), {"bias": False}),
        (lambda: stack(nn.LayerNorm(16, eps=1e-3)), {"final_eps": 1e-3}),
        (lambda: layer(activation=torch.nn.functional.gelu), {"num_layers": 1, "activation": "gelu"}),
    ],
    ids=["relu-post-ln", "gelu-8-heads-pre-ln", "gelu-tanh", "nn-relu", "bias-false", "post-ln-final-norm", "layer"],
)
def test_every_setting_is_read_from_the_module(
    tmp_path: Path, build: Callable[[], nn.Module], expected: dict[str, Any]
) -> None:
    user = user_encoder(perturbed(build()), tmp_path / "m.pt", 32, None)
    defaults = {"positional_encoding": "none", "final_norm": "final_eps" in expected}
    assert user.twin.cfg == EncoderConfig(**{**BASE, **defaults, **expected})


def assert_twin_answers_as_the_module(user: UserEncoder) -> None:
    """The twin and the user's module (its forward) agree at unpadded positions, one sequence partly padded."""
    x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    mask = np.zeros((2, 5), dtype=bool)
    mask[1, 3:] = True
    with torch.no_grad():
        got = user.twin(torch.from_numpy(x), torch.from_numpy(mask))[0].numpy()
    np.testing.assert_allclose(got[~mask], user.forward(x, mask)[~mask], atol=1e-5)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("pe", [None, "sinusoidal"])
def test_the_forward_is_the_module_in_eval_mode_on_the_served_layout(batch_first: bool, pe: str | None) -> None:
    module = perturbed(nn.TransformerEncoder(layer(batch_first=batch_first), 1, enable_nested_tensor=False))
    user = user_encoder(module, Path("m.pt"), 32, pe)
    assert_twin_answers_as_the_module(user)
    assert user.source == {"class": "torch.nn.TransformerEncoder", "batch_first": batch_first}
    assert user.twin.cfg.positional_encoding == (pe or "none")


def plain_norms(module: nn.TransformerEncoder, **kw: Any) -> nn.TransformerEncoder:
    """The layers' LayerNorms replaced by ones without bias or weight, the linear layers' biases kept."""
    for each in module.layers:
        each.norm1, each.norm2 = nn.LayerNorm(16, **kw), nn.LayerNorm(16, **kw)
    return module


@pytest.mark.parametrize(
    ("build", "note"),
    [
        (lambda: stack(activation="gelu"), None),
        (lambda: stack(activation=nn.GELU(approximate="tanh")), TANH_NOTE),
        (lambda: plain_norms(stack(), bias=False), NORM_NOTE),
        (lambda: plain_norms(stack(norm_first=True), elementwise_affine=False), NORM_NOTE),
        (lambda: plain_norms(stack(activation=nn.GELU(approximate="tanh")), bias=False), f"{TANH_NOTE}; {NORM_NOTE}"),
    ],
    ids=["fast-path", "gelu-tanh", "norm-bias-false", "norm-not-affine", "both"],
)
def test_a_module_torchs_fast_path_answers_differently_or_fails_on_is_run_off_it(
    build: Callable[[], nn.Module], note: str | None
) -> None:
    """torch 2.13's fast path raises AttributeError on a layer's LayerNorm without bias or weight: the module's
    forward is measured on the ordinary path, which computes the same layer, and the export says so."""
    module = perturbed(build())
    user = user_encoder(module, Path("m.pt"), 32, None)
    assert_twin_answers_as_the_module(user)
    assert user.source.get("note") == note
    assert torch.backends.mha.get_fastpath_enabled()  # restored after the forward


def test_a_whole_module_round_trips_through_torch_save(tmp_path: Path) -> None:
    module = perturbed(stack())
    loaded = load_module(saved(module, tmp_path))
    assert isinstance(loaded, nn.TransformerEncoder) and not loaded.training


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (
            lambda: stack(activation=swish),
            "layers.0.activation is swish, which normserve cannot serve exactly; it serves relu and gelu "
            '("relu", "gelu", F.relu, F.gelu, nn.ReLU(), nn.GELU(approximate="none"|"tanh"))',
        ),
        (
            lambda: stack(activation=nn.SiLU()),
            "layers.0.activation is torch.nn.SiLU, which normserve cannot serve exactly; it serves relu and gelu "
            '("relu", "gelu", F.relu, F.gelu, nn.ReLU(), nn.GELU(approximate="none"|"tanh"))',
        ),
        (lambda: stack(nn.RMSNorm(16)), "norm is a torch.nn.RMSNorm; normserve serves torch.nn.LayerNorm only"),
        (
            lambda: nn.LayerNorm(64),
            "this is a torch.nn.LayerNorm module (normalized_shape [64]): `normserve export layernorm --module` "
            "takes it",
        ),
        (
            lambda: nn.Linear(4, 4),
            "this is a torch.nn.Linear module; `normserve export encoder --module` takes torch.nn.TransformerEncoder, "
            "torch.nn.TransformerEncoderLayer or normserve's Encoder",
        ),
    ],
    ids=["custom-function", "silu", "rms-norm", "layernorm", "linear"],
)
def test_what_cannot_be_served_exactly_is_refused_by_name(build: Callable[[], nn.Module], problem: str) -> None:
    with pytest.raises(CheckpointError) as e:
        user_encoder(build(), Path("m.pt"), 32, None)
    assert str(e.value) == f"m.pt: {problem}"


def test_a_replaced_layer_norm_is_refused_by_name() -> None:
    module = stack()
    module.layers[1].norm2 = nn.RMSNorm(16)
    with pytest.raises(CheckpointError) as e:
        user_encoder(module, Path("m.pt"), 32, None)
    assert str(e.value) == "m.pt: layers.1.norm2 is a torch.nn.RMSNorm; normserve serves torch.nn.LayerNorm only"


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (
            lambda: nn.RMSNorm(16),
            "this is a torch.nn.RMSNorm module, which normserve cannot serve exactly (it does not subtract the "
            "mean); `normserve export layernorm --module` takes torch.nn.LayerNorm",
        ),
        (
            lambda: stack(),
            "this is a torch.nn.TransformerEncoder module: `normserve export encoder --module` takes it",
        ),
    ],
    ids=["rms-norm", "encoder"],
)
def test_a_layernorm_export_refuses_other_modules_naming_them(build: Callable[[], nn.Module], problem: str) -> None:
    with pytest.raises(CheckpointError) as e:
        user_layernorm(build(), Path("m.pt"))
    assert str(e.value) == f"m.pt: {problem}"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ({"weight": torch.ones(4)}, "a state_dict, not a whole module; export it with --checkpoint"),
        ([1, 2], "a list, not a module saved with torch.save(module)"),
    ],
    ids=["state-dict", "list"],
)
def test_a_file_without_a_module_is_refused(tmp_path: Path, content: object, problem: str) -> None:
    path = tmp_path / "m.pt"
    torch.save(content, path)
    with pytest.raises(CheckpointError) as e:
        load_module(path)
    assert str(e.value) == f"{path}: {problem}"
