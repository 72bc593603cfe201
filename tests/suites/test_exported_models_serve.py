"""Users' models exported by `normserve export encoder|layernorm` load in the server's runtime and answer as torch does.

The exporter's output is the runtime's input: this runs one into the other, in process, with real
checkpoints (tests/export/trained.py) and no hand-made manifest in between.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as tg
import tritonclient.http as th
from torch import nn

from app.core import reference
from app.core.dataplane import EncodeInput
from app.core.encoder import EncoderModel
from app.core.layernorm import LayerNormModel
from app.core.reference import EncoderConfig
from app.core.runtime import Runtime
from app.core.seeds import SEED003
from app.export.exporter import export_defaults, export_encoder, export_layernorm
from app.export.exporter import main as export_main
from app.settings import Settings
from tests.export.trained import USER_ENCODERS, UserEncoder, layer_norm, save, torch_encode
from tests.live_server import ROOT, live_server
from tests.repositories import copy_models
from tests.server.api.v2.grpc.live import GrpcServer, grpc_server
from tests.suites.test_docs_examples import WALKTHROUGH, WALKTHROUGH_SCRIPT, examples_of

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


# ---- users' own modules, exported whole (--module) or as state_dicts, served and compared with the modules ----

ENCODER_ATOL = 2e-4  # the module's float32 forward vs the served float32 graph: the bounds
LAYERNORM_ATOL = 1e-5


def _perturbed(module: nn.Module, seed: int) -> nn.Module:
    """Every weight moved away from torch's init (LayerNorm's 1 and 0 above all), in eval mode."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return module.eval()


def _layer(d: int, heads: int, **kw: Any) -> nn.TransformerEncoderLayer:
    return nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, **{"batch_first": True, **kw})


@dataclass(frozen=True)
class UserModule:
    id: str
    build: Callable[[], nn.Module]
    how: str  # "module", or "checkpoint" with flags
    flags: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "layernorm" if self.id.startswith("ln-") else "encoder"


USER_MODULES = [
    UserModule(
        "gelu-8-heads-pre-ln",
        lambda: nn.TransformerEncoder(
            _layer(32, 8, activation="gelu", norm_first=True, layer_norm_eps=1e-6),
            2,
            norm=nn.LayerNorm(32, eps=1e-6),
            enable_nested_tensor=False,
        ),
        "module",
    ),
    UserModule(
        "bias-false",
        lambda: nn.TransformerEncoder(_layer(16, 2, bias=False), 2, norm=nn.LayerNorm(16), enable_nested_tensor=False),
        "module",
    ),
    UserModule(
        "relu-post-ln-state-dict", lambda: nn.TransformerEncoder(_layer(16, 4), 2), "checkpoint", {"num_heads": 4}
    ),
    UserModule(
        "gelu-state-dict",
        lambda: nn.TransformerEncoder(_layer(16, 2, activation="gelu"), 1),
        "checkpoint",
        {"num_heads": 2, "activation": "gelu"},
    ),
    UserModule("lone-layer", lambda: _layer(16, 4, activation=nn.GELU(), norm_first=True), "module"),
    UserModule(
        "batch-first-false",
        lambda: nn.TransformerEncoder(_layer(16, 2, batch_first=False), 2, enable_nested_tensor=False),
        "module",
    ),
    UserModule("ln-bias-false", lambda: nn.LayerNorm(16, bias=False), "module"),
    UserModule("ln-affine-false", lambda: nn.LayerNorm(16, elementwise_affine=False, eps=1e-3), "module"),
    UserModule("ln-two-dims", lambda: nn.LayerNorm((3, 8)), "module"),
]
ENCODERS = [u for u in USER_MODULES if u.kind == "encoder"]
LAYERNORMS = [u for u in USER_MODULES if u.kind == "layernorm"]
TOKEN = "acceptance-token"


@dataclass(frozen=True)
class Served:
    server: GrpcServer
    modules: dict[str, nn.Module]


def _export(root: Path, user: UserModule, module: nn.Module, base: Path) -> None:
    path = base / f"{user.id}.pt"
    torch.save(module if user.how == "module" else module.state_dict(), path)
    source = {user.how: path}
    if user.kind == "layernorm":
        export_layernorm(root, user.id, **source)
    else:
        export_encoder(root, user.id, **source, sizes={"max_sequence_length": 32, **user.flags})


@pytest.fixture(scope="module")
def served_modules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One repository of every user module, one server (HTTP and gRPC) for every test of them."""
    base = tmp_path_factory.mktemp("modules")
    root = base / "models"
    modules = {}
    for i, user in enumerate(USER_MODULES):
        modules[user.id] = _perturbed(user.build(), seed=i)
        _export(root, user, modules[user.id], base)
    env = {"NORMSERVE_MODEL_DIR": str(root), "NORMSERVE_ADMIN_TOKEN": TOKEN}
    with grpc_server(base, env) as server:
        yield Served(server, modules)


def _module_encode(module: nn.Module, x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """The user's module itself, float32, eval mode; batch_first=False takes (T,B,C)."""
    batch_first = (module.layers[0] if isinstance(module, nn.TransformerEncoder) else module).self_attn.batch_first
    src = torch.from_numpy(x if batch_first else x.transpose(1, 0, 2).copy())
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The PyTorch API of nested tensors", UserWarning)  # torch's fast path
        out = module(src, src_key_padding_mask=None if mask is None else torch.from_numpy(mask)).numpy()
    return out if batch_first else out.transpose(1, 0, 2)


def _encoder_answers(served: Served, name: str, x: np.ndarray, mask: np.ndarray | None) -> dict[str, np.ndarray]:
    """The served output over /encode, V2 HTTP (tritonclient.http) and V2 gRPC (tritonclient.grpc)."""
    body: dict[str, Any] = {"model": name, "data": x.tolist()}
    tensors = {"input": x}
    if mask is not None:
        body["padding_mask"] = mask.tolist()
        tensors["padding_mask"] = mask
    r = httpx.post(f"{served.server.base}/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return {"rest": np.asarray(r.json()["output"], dtype=np.float32), **_v2(served, name, tensors)}


def _v2(served: Served, name: str, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    answers = {}
    for label, client_module, url in (
        ("v2-http", th, served.server.base.removeprefix("http://")),
        ("v2-grpc", tg, served.server.address),
    ):
        inputs = []
        for key, value in tensors.items():
            t = client_module.InferInput(key, list(value.shape), "BOOL" if value.dtype == bool else "FP32")
            t.set_data_from_numpy(value)
            inputs.append(t)
        client = client_module.InferenceServerClient(url)
        try:
            answers[label] = client.infer(name, inputs).as_numpy("output")
        finally:
            client.close()
    return answers


@pytest.mark.parametrize("user", ENCODERS, ids=lambda u: u.id)
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding-mask"])
def test_a_served_user_encoder_answers_as_the_module_itself(
    served_modules: Served, user: UserModule, masked: bool
) -> None:
    module = served_modules.modules[user.id]
    d = (module.layers[0] if isinstance(module, nn.TransformerEncoder) else module).self_attn.embed_dim
    x = np.random.default_rng(11).standard_normal((3, 6, d)).astype(np.float32)
    mask = None
    if masked:
        mask = np.zeros((3, 6), dtype=bool)
        mask[1, 4:] = True
        mask[2, 1:] = True
    expected = _module_encode(module, x, mask)
    keep = np.ones((3, 6), dtype=bool) if mask is None else ~mask  # torch's fast path answers 0 at padded ones
    for protocol, got in _encoder_answers(served_modules, user.id, x, mask).items():
        np.testing.assert_allclose(got[keep], expected[keep], atol=ENCODER_ATOL, rtol=0, err_msg=protocol)


@pytest.mark.parametrize("user", LAYERNORMS, ids=lambda u: u.id)
def test_a_served_user_layernorm_answers_as_the_module_itself(served_modules: Served, user: UserModule) -> None:
    module = served_modules.modules[user.id]
    assert isinstance(module, nn.LayerNorm)
    x = (3 * np.random.default_rng(12).standard_normal((4, *module.normalized_shape)) + 1).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    r = httpx.post(f"{served_modules.server.base}/normalize", json={"model": user.id, "data": x.tolist()}, timeout=60)
    assert r.status_code == 200, r.text
    answers = {"rest": np.asarray(r.json()["output"], dtype=np.float32), **_v2(served_modules, user.id, {"input": x})}
    for protocol, got in answers.items():
        np.testing.assert_allclose(got, expected, atol=LAYERNORM_ATOL, rtol=0, err_msg=protocol)


@pytest.mark.parametrize("user", ENCODERS, ids=lambda u: u.id)
def test_a_served_user_encoder_validates_against_the_float64_reference(
    served_modules: Served, user: UserModule
) -> None:
    d = 32 if user.id == "gelu-8-heads-pre-ln" else 16
    x = np.random.default_rng(13).standard_normal((2, 5, d)).astype(np.float32)
    r = httpx.post(
        f"{served_modules.server.base}/encode",
        json={
            "model": user.id,
            "data": x.tolist(),
            "padding_mask": [[False] * 5, [False] * 3 + [True] * 2],
            "validate": True,
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    validation = r.json()["validation"]
    assert validation["passed"] and validation["max_abs_diff"] <= ENCODER_ATOL


def test_the_readme_walkthrough_serves_what_the_module_computes(tmp_path: Path) -> None:
    """The README's steps as written: export the module (--module) into a copy of the models, serve it, and run
    the README's script that asks the server and the module the same question."""
    repo = tmp_path / "my-models"
    copy_models(repo)
    argv = shlex.split(WALKTHROUGH[1])
    assert argv[:3] == ["normserve", "export", "encoder"]
    assert export_main([a if a != "my-models" else str(repo) for a in argv[2:]], progress=lambda _m: None) == 0
    script = WALKTHROUGH_SCRIPT
    assert [e.kind for e in examples_of(ROOT / "README.md") if e.code == script] == ["script"], "the README's own"
    env = {"NORMSERVE_MODEL_DIR": str(repo), "NORMSERVE_MODEL_CONTROL": "explicit", "NORMSERVE_ADMIN_TOKEN": TOKEN}
    with live_server(env) as base:
        code = script.replace("http://127.0.0.1:8000", base)
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    label = "max |served - module| at unpadded positions: "
    assert first.startswith(label) and float(first.removeprefix(label)) <= ENCODER_ATOL
    passed, figure = second.removeprefix("validation passed: ").split(", max_abs_diff ")
    assert passed == "True" and float(figure) <= ENCODER_ATOL
