"""A version whose files match their sha256 but are broken fails its load cleanly, in every model control mode.

Each broken kind is built in tmp_path from the committed models, its manifest's sha256s updated, so that
only the breakage itself stops it. A failed load is: 400 naming the file and the reason (explicit), state
UNAVAILABLE with that reason in the index, `normserve_model_load_failures_total{model,version}`, an ERROR
line naming the model; at start-up readiness names each failure while the other models serve; poll mode
logs each. One server per mode holds every broken version.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from app.core import reference
from app.errors import shown
from tests.live_server import MODELS
from tests.polling import wait_until
from tests.repositories import copy_models
from tests.server.api.v2.grpc.live import GrpcServer, grpc_server

TOKEN = "broken-versions-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
Mutate = Callable[[Path, dict[str, Any]], None]
CONFIG_FIELDS = (
    "activation, bias, d_ff, d_model, eps, final_eps, final_norm, max_sequence_length, norm_first, num_heads, "
    "num_layers, positional_encoding"
)
LN_INPUTS = "input[rows,cols], gamma[cols], beta[cols], eps_var[rows,1], eps_std[rows,1]"
ENC_INPUTS = "input[batch,seq,128], padding_mask[batch,seq]"


def _write(name: str, data: bytes) -> Mutate:
    def mutate(folder: Path, _: dict[str, Any]) -> None:
        (folder / name).write_bytes(data)

    return mutate


def _config(**changes: Any) -> Mutate:
    def mutate(_: Path, manifest: dict[str, Any]) -> None:
        manifest["config"] = {**manifest["config"], **changes}

    return mutate


def _field(key: str, value: Any) -> Mutate:
    def mutate(_: Path, manifest: dict[str, Any]) -> None:
        manifest[key] = value

    return mutate


def _unlisted_corrupt_weights(folder: Path, manifest: dict[str, Any]) -> None:
    (folder / "weights.npz").write_bytes(b"PK\x03\x04 not a zip")
    del manifest["files"]["weights.npz"]


def _renamed_input(_: Path, manifest: dict[str, Any]) -> None:
    manifest["inputs"][0]["name"] = "x"


ENCODER_CONFIG = json.loads((MODELS / "encoder/1/manifest.json").read_text())["config"]
LAYER_NORMS = ["layers.0.norm1", "layers.0.norm2", "layers.1.norm1", "layers.1.norm2"]
LN_LISTED = json.loads((MODELS / "layernorm/1/manifest.json").read_text())["inputs"]

# (name, base model, breakage, the reason with {m} for the model's folder, version 1)
CASES: list[tuple[str, str, Mutate, str]] = [
    (
        "garbage-onnx",
        "layernorm",
        _write("model.onnx", np.random.default_rng(7).bytes(1000)),
        "{m}/1/model.onnx: onnxruntime cannot load it: Protobuf parsing failed.",
    ),
    (
        "empty-onnx",
        "layernorm",
        _write("model.onnx", b""),
        "{m}/1/model.onnx: onnxruntime cannot load it: No graph was found in the protobuf.",
    ),
    (
        "d-model-disagrees",
        "encoder",
        _config(d_model=64),
        "{m}"
        f"/1/manifest.json: the graph's inputs are {ENC_INPUTS}; the encoder kind with this config expects "
        "input[batch,seq,64], padding_mask[batch,seq]",
    ),
    (
        "num-heads-zero",
        "encoder",
        _config(num_heads=0),
        "{m}/1/manifest.json: config.num_heads 0; expected a positive integer",
    ),
    (
        "num-heads-not-dividing",
        "encoder",
        _config(num_heads=3),
        "{m}/1/manifest.json: config.num_heads 3 does not divide config.d_model 128",
    ),
    (
        "d-model-a-string",
        "encoder",
        _config(d_model="128"),
        "{m}/1/manifest.json: config.d_model '128'; expected a positive integer",
    ),
    (
        "max-sequence-length-zero",
        "encoder",
        _config(max_sequence_length=0),
        "{m}/1/manifest.json: config.max_sequence_length 0; expected a positive integer",
    ),
    (
        "max-sequence-length-past-the-graph",
        "encoder",
        _config(max_sequence_length=1024),
        "{m}/1/manifest.json: config.max_sequence_length 1024: the graph fails on a sequence that long (Fail)",
    ),
    (
        "unknown-config-field",
        "encoder",
        _config(dropout=0.1),
        "{m}"
        f"/1/manifest.json: config {shown({**ENCODER_CONFIG, 'dropout': 0.1})}; an encoder's config "
        f"has {CONFIG_FIELDS}",
    ),
    (
        "unknown-activation",
        "encoder",
        _config(activation="swish"),
        "{m}/1/manifest.json: config.activation 'swish'; expected one of relu, gelu, gelu_tanh",
    ),
    (
        "unknown-positional-encoding",
        "encoder",
        _config(positional_encoding="learned"),
        "{m}/1/manifest.json: config.positional_encoding 'learned'; expected one of none, sinusoidal",
    ),
    (
        "layer-norms-disagree",
        "encoder",
        _field("layer_norms", LAYER_NORMS[:3]),
        f"{{m}}/1/manifest.json: layer_norms {shown(LAYER_NORMS[:3])}; an encoder with this config has {LAYER_NORMS}",
    ),
    (
        "unlisted-corrupt-weights",
        "encoder",
        _unlisted_corrupt_weights,
        "{m}/1/weights.npz: not listed in the manifest's files, so its sha256 cannot be checked",
    ),
    (
        "corrupt-weights",
        "encoder",
        _write("weights.npz", b"PK\x03\x04 not a zip"),
        "{m}/1/weights.npz: unreadable weights (BadZipFile: File is not a zip file)",
    ),
    (
        "nested-manifest",
        "layernorm",
        _write("manifest.json", b"[" * 100_000 + b"]" * 100_000),
        "{m}/1: unreadable manifest (nested too deeply)",
    ),
    (
        "manifest-a-list",
        "layernorm",
        _write("manifest.json", b"[]"),
        "{m}/1: unreadable manifest ({m}/1/manifest.json: format_version None; this server reads 2)",
    ),
    (
        "kind-swapped",
        "encoder",
        _field("kind", "layernorm"),
        "{m}"
        f"/1/manifest.json: the graph's inputs are {ENC_INPUTS}; the layernorm kind with this config expects "
        f"{LN_INPUTS}",
    ),
    (
        "manifest-inputs-disagree",
        "layernorm",
        _renamed_input,
        "{m}"
        f"/1/manifest.json: inputs {shown([{**LN_LISTED[0], 'name': 'x'}, *LN_LISTED[1:]])} do not match "
        f"the graph's {LN_INPUTS}",
    ),
    (
        "eps-negative",
        "layernorm",
        _config(eps=-1),
        "{m}/1/manifest.json: config.eps -1; expected a positive finite number",
    ),
]
NAMES = [f"broken-{case[0]}" for case in CASES]
REASONS = {f"broken-{name}": reason.replace("{m}", f"broken-{name}") for name, _, _, reason in CASES}


def build_broken(root: Path) -> None:
    """Every broken version of CASES as a model of its own under root, each file's sha256 in its manifest."""
    for name, base, mutate, _ in CASES:
        staging = root / f".broken-{name}"
        shutil.copytree(MODELS / base / "1", staging / "1")
        manifest = json.loads((staging / "1/manifest.json").read_text())
        manifest["name"] = f"broken-{name}"
        before = (staging / "1/manifest.json").read_bytes()
        mutate(staging / "1", manifest)
        for file in manifest["files"]:
            manifest["files"][file] = hashlib.sha256((staging / "1" / file).read_bytes()).hexdigest()
        if (staging / "1/manifest.json").read_bytes() == before:  # the breakage is not the manifest's own text
            (staging / "1/manifest.json").write_text(json.dumps(manifest))
        staging.rename(root / f"broken-{name}")  # whole, for a poll that may scan meanwhile


def _index(server: GrpcServer) -> dict[str, tuple[str, str]]:
    rows = httpx.post(f"{server.base}/v2/repository/index", headers=AUTH, timeout=30).json()
    return {row["name"]: (row["state"], row["reason"]) for row in rows}


def _failures(server: GrpcServer) -> dict[str, float]:
    text = httpx.get(f"{server.base}/metrics", timeout=30).text
    found = {}
    for line in text.splitlines():
        if line.startswith("normserve_model_load_failures_total{"):
            labels, value = line.rsplit(" ", 1)
            model = labels.split('model="', 1)[1].split('"', 1)[0]
            found[model] = float(value)
    return found


def _errors(server: GrpcServer) -> dict[str, str]:
    """The ERROR line of each model's failed version, by model."""
    return {
        d["model"]: d["msg"]
        for d in server.log_lines()
        if d["level"] == "error" and d["logger"] == "normserve.models" and d["msg"].startswith(f"model {d['model']} ")
    }


def _assert_failed_cleanly(server: GrpcServer, loads: int = 1) -> None:
    """Index, metric and log line of every broken version (tried `loads` times); the good models serve, correctly."""
    index = _index(server)
    assert {n: index[n] for n in NAMES} == {n: ("UNAVAILABLE", REASONS[n]) for n in NAMES}
    assert index["layernorm"] == ("READY", "") and index["encoder"] == ("READY", "")
    failures = _failures(server)
    assert {n: failures.get(n) for n in NAMES} == dict.fromkeys(NAMES, float(loads))
    errors = _errors(server)
    assert {n: errors.get(n) for n in NAMES} == {n: f"model {n} version 1 failed to load: {REASONS[n]}" for n in NAMES}
    body = {"inputs": [{"name": "input", "shape": [1, 1, 128], "datatype": "FP32", "data": [0.5] * 128}]}
    for name in NAMES:  # never served: 404, or 503 naming the failure while the server is not ready; never a 500
        r = httpx.post(f"{server.base}/v2/models/{name}/infer", json=body, timeout=30)
        assert r.status_code in (404, 503), (name, r.status_code, r.text)
    x = np.array([[0.5, -1.0, 2.0], [3.0, 0.25, -0.5]])
    r = httpx.post(f"{server.base}/normalize", json={"data": x.tolist()}, timeout=30)
    assert r.status_code == 200
    np.testing.assert_allclose(r.json()["output"], reference.layer_norm(x).output, atol=1e-5)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    return copy_models(tmp_path / "models", ("layernorm", "encoder"))


def _env(root: Path, **extra: str) -> dict[str, str]:
    return {"NORMSERVE_MODEL_DIR": str(root), "NORMSERVE_ADMIN_TOKEN": TOKEN, **extra}


def test_at_start_up_readiness_names_every_failure_and_the_other_models_serve(repository: Path, tmp_path: Path) -> None:
    build_broken(repository)
    with grpc_server(tmp_path, _env(repository), wait_ready=False) as server:
        ready = lambda: httpx.get(f"{server.base}/v2/health/ready", timeout=30)  # noqa: E731
        wait_until(lambda: "model check failed" in ready().text, timeout=120)
        r = ready()
        reasons = "; ".join(REASONS[n] for n in sorted(NAMES))
        assert (r.status_code, r.json()) == (
            503,
            {"ready": False, "error": f"not ready: model check failed: {reasons}"},
        )
        _assert_failed_cleanly(server)


def test_an_explicit_load_of_each_is_a_400_or_invalid_argument_naming_the_file_and_the_reason(
    repository: Path, tmp_path: Path
) -> None:
    build_broken(repository)
    env = _env(repository, NORMSERVE_MODEL_CONTROL="explicit", NORMSERVE_STARTUP_MODELS="layernorm,encoder")
    with grpc_server(tmp_path, env) as server:
        with tg.InferenceServerClient(server.address) as triton:
            for name in NAMES:
                message = f"failed to load model {name!r}: {REASONS[name]}"
                r = httpx.post(f"{server.base}/v2/repository/models/{name}/load", headers=AUTH, timeout=60)
                assert (r.status_code, r.json()) == (400, {"error": message})
                with pytest.raises(InferenceServerException) as e:
                    triton.load_model(name, headers={"authorization": AUTH["Authorization"]})
                assert (e.value.status(), e.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)
        _assert_failed_cleanly(server, loads=2)
        assert httpx.get(f"{server.base}/v2/health/ready", timeout=30).status_code == 200


def test_poll_logs_each_failure_with_the_model_and_the_reason(repository: Path, tmp_path: Path) -> None:
    env = _env(repository, NORMSERVE_MODEL_CONTROL="poll", NORMSERVE_POLL_INTERVAL_S="0.2")
    with grpc_server(tmp_path, env) as server:
        build_broken(repository)  # after start-up: the poll finds them
        wait_until(lambda: set(NAMES) <= set(_errors(server)), timeout=120)
        polled = {d["model"]: d["msg"] for d in server.log_lines() if d["msg"].startswith("poll: ")}
        assert {n: polled.get(n) for n in NAMES} == {
            n: f"poll: failed to load model {n!r}: {REASONS[n]}" for n in NAMES
        }
        _assert_failed_cleanly(server)
        assert httpx.get(f"{server.base}/v2/health/ready", timeout=30).status_code == 200


def test_a_server_whose_start_failed_is_ready_once_poll_loads_the_fixed_version(
    repository: Path, tmp_path: Path
) -> None:
    build_broken(repository)
    broken = [n for n in NAMES if n != "broken-garbage-onnx"]
    for name in broken:  # one broken model left: the one fixed below
        shutil.rmtree(repository / name)
    env = _env(repository, NORMSERVE_MODEL_CONTROL="poll", NORMSERVE_POLL_INTERVAL_S="0.2")
    with grpc_server(tmp_path, env, wait_ready=False) as server:
        ready = lambda: httpx.get(f"{server.base}/v2/health/ready", timeout=30)  # noqa: E731
        wait_until(lambda: "model check failed" in ready().text, timeout=120)
        reason = REASONS["broken-garbage-onnx"]
        assert ready().json() == {"ready": False, "error": f"not ready: model check failed: {reason}"}
        staging = repository / ".fixed"
        shutil.copytree(MODELS / "layernorm", staging)
        shutil.rmtree(repository / "broken-garbage-onnx")
        staging.rename(repository / "broken-garbage-onnx")  # the version as exported, whole
        wait_until(lambda: ready().status_code == 200, timeout=120)
        assert _index(server)["broken-garbage-onnx"] == ("READY", "")
