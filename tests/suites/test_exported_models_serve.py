"""Users' models exported by `normserve export encoder|layernorm` load in the server's runtime and answer as torch does.

The exporter's output is the runtime's input: this runs one into the other, in process, with real
checkpoints (tests/export/trained.py) and no hand-made manifest in between.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch
from torch import nn

from app.core import reference
from app.core.dataplane import EncodeInput
from app.core.encoder import EncoderModel
from app.core.layernorm import LayerNormModel
from app.core.reference import EncoderConfig
from app.core.runtime import Runtime
from app.core.seeds import SEED003
from app.export.exporter import export_defaults, export_encoder, export_layernorm
from app.settings import Settings
from tests.export.trained import USER_ENCODERS, UserEncoder, layer_norm, save, torch_encode
from tests.live_server import live_server

ATOL = 1e-4
SMALL_DEFAULTS = {"d_model": 16, "num_heads": 2, "d_ff": 32, "num_layers": 1, "max_sequence_length": 32}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Runtime, dict[str, nn.Module]]:
    """A repository with small defaults, both user encoders (the first twice) and a learned LayerNorm, loaded."""
    base = tmp_path_factory.mktemp("served")
    root = base / "models"
    export_defaults(root, config=EncoderConfig(**SMALL_DEFAULTS))
    modules: dict[str, nn.Module] = {}
    for spec in USER_ENCODERS:
        modules[spec.id] = spec.build()
        sizes = {"num_heads": spec.cfg.num_heads, "max_sequence_length": spec.cfg.max_sequence_length}
        for _ in range(1 if spec is USER_ENCODERS[1] else 2):
            export_encoder(root, spec.id, save(modules[spec.id], base / f"{spec.id}.pt"), sizes=sizes)
    modules["my-layernorm"] = layer_norm((2, 8), eps=1e-3)
    export_layernorm(root, "my-layernorm", save(modules["my-layernorm"], base / "ln.pt"), eps=1e-3)
    runtime = Runtime(Settings(model_dir=root))
    runtime.load()  # sha256 of every file, sessions, and each version's parity warm-up
    return runtime, modules


def test_every_export_loads_and_the_latest_version_serves(served: tuple[Runtime, dict[str, nn.Module]]) -> None:
    runtime, _ = served
    assert [(m.name, m.version) for m in runtime.models] == [
        ("encoder", "1"),
        ("encoder-preln", "1"),
        ("layernorm", "1"),
        ("my-layernorm", "1"),
        ("post-ln-32x4x1", "2"),
        ("pre-ln-48x6x3", "1"),
    ]


@pytest.mark.parametrize("spec", USER_ENCODERS, ids=lambda u: u.id)
def test_a_served_user_encoder_answers_as_torch(
    served: tuple[Runtime, dict[str, nn.Module]], spec: UserEncoder
) -> None:
    runtime, modules = served
    name = spec.id
    model = runtime.get(name)
    assert isinstance(model, EncoderModel)
    x = np.random.default_rng(5).standard_normal((2, 7, model.config.d_model)).astype(np.float32)
    mask = np.zeros((2, 7), dtype=bool)
    mask[1, 4:] = True
    out = model.infer(EncodeInput(x, mask, model.limits, validate=True))
    assert out.validation is not None and out.validation["passed"]
    module = modules[name]
    assert isinstance(module, nn.TransformerEncoder)
    np.testing.assert_allclose(out.output, torch_encode(module, x, mask), atol=ATOL, rtol=0)


def test_a_served_learned_layernorm_uses_its_gamma_beta_and_eps(served: tuple[Runtime, dict[str, nn.Module]]) -> None:
    runtime, modules = served
    model = runtime.get("my-layernorm")
    assert isinstance(model, LayerNormModel)
    assert (model.normalized_shape, model.eps) == ((2, 8), 1e-3)
    x = (3 * np.random.default_rng(6).standard_normal((4, 2, 8))).astype(np.float32)
    out = model.infer(model.request(x))  # no gamma, beta or eps in the request: the checkpoint's
    with torch.no_grad():
        expected = modules["my-layernorm"](torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out.output, expected, atol=ATOL, rtol=0)


def test_a_live_server_serves_them_beside_the_defaults(served: tuple[Runtime, dict[str, nn.Module]]) -> None:
    """Over HTTP: each user encoder as torch's module and as the NumPy reference on its exported weights, the
    learned LayerNorm as torch's, and the default layernorm still on seed 003's worked example."""
    runtime, modules = served
    with live_server({"NORMSERVE_MODEL_DIR": str(runtime.repository.root)}) as base:
        for spec in USER_ENCODERS:
            model = runtime.get(spec.id)
            assert isinstance(model, EncoderModel)
            x = np.random.default_rng(8).standard_normal((2, 6, model.config.d_model)).astype(np.float32)
            mask = np.zeros((2, 6), dtype=bool)
            mask[0, 3:] = True
            body = {"model": spec.id, "data": x.tolist(), "padding_mask": mask.tolist()}
            r = httpx.post(f"{base}/encode", json=body, timeout=60)
            assert r.status_code == 200, r.text
            out = np.asarray(r.json()["output"])
            module = modules[spec.id]
            assert isinstance(module, nn.TransformerEncoder)
            np.testing.assert_allclose(out, torch_encode(module, x, mask), atol=ATOL, rtol=0)
            ref, _ = reference.encoder(x, model.weights, model.config, mask)
            np.testing.assert_allclose(out, ref, atol=ATOL, rtol=0)
            assert r.json()["model"]["version"] == model.version
        x = (3 * np.random.default_rng(9).standard_normal((3, 2, 8))).astype(np.float32)
        r = httpx.post(f"{base}/normalize", json={"model": "my-layernorm", "data": x.tolist()}, timeout=60)
        with torch.no_grad():
            expected = modules["my-layernorm"](torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(np.asarray(r.json()["output"]), expected, atol=ATOL, rtol=0)
        r = httpx.post(f"{base}/normalize", json={"data": SEED003.x, "normalized_shape": [3]}, timeout=60)
        np.testing.assert_allclose(np.asarray(r.json()["output"]), SEED003.output, atol=ATOL, rtol=0)
