"""app/cli/serve.py: `normserve serve`: options whose defaults are the NORMSERVE_* settings, export first, uvicorn."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.cli import serve
from app.server import group
from benchmarks.servers import HOST, free_port, server_process
from tests.cli.normserve import NORMSERVE
from tests.live_server import MODELS


@pytest.fixture(autouse=True)
def no_normserve_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees only the NORMSERVE_* variables it sets itself."""
    for name in list(os.environ):
        if name.upper().startswith("NORMSERVE_"):
            monkeypatch.delenv(name)


def test_help_shows_the_defaults_that_the_environment_sets(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"HOST": "0.0.0.0", "PORT": "9001", "GRPC_PORT": "9002", "WORKERS": "3", "MODEL_DIR": "/srv/normserve"}
    for name, value in env.items():
        monkeypatch.setenv(f"NORMSERVE_{name}", value)
    with pytest.raises(SystemExit) as e:
        serve.command(["--help"])
    assert e.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal's width
    for name, value in env.items():
        assert f"(NORMSERVE_{name}, default {value})" in help_text


@pytest.mark.parametrize("workers", ["0", "-2"])
def test_fewer_than_one_worker_is_refused(capsys: pytest.CaptureFixture[str], workers: str) -> None:
    with pytest.raises(SystemExit) as e:
        serve.command(["--workers", workers, "--model-dir", str(MODELS)])
    assert e.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == f"normserve serve: error: --workers must be at least 1, not {workers}"
    )


def test_a_port_in_use_is_refused_at_once_before_any_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve.command(["--port", str(port), "--model-dir", str(tmp_path / "no-models")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"normserve serve: error: port {port} on {HOST} is already in use; choose another with --port or NORMSERVE_PORT"
    ]
    assert not (tmp_path / "no-models").exists()


@pytest.fixture
def listening_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        yield int(taken.getsockname()[1])


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_a_grpc_port_in_use_is_refused_at_once_naming_the_option_and_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, listening_port: int, how: str
) -> None:
    args = ["--port", str(free_port()), "--model-dir", str(tmp_path / "no-models")]
    if how == "flag":
        args += ["--grpc-port", str(listening_port)]
    else:
        monkeypatch.setenv("NORMSERVE_GRPC_PORT", str(listening_port))
    assert serve.command(args) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"normserve serve: error: gRPC port {listening_port} on {HOST} is already in use; "
        "choose another with --grpc-port or NORMSERVE_GRPC_PORT"
    ]
    assert not (tmp_path / "no-models").exists()


def test_a_grpc_port_claimed_by_another_server_is_refused_before_it_listens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    with group.claim_grpc_port(port, owner="4242-1"):  # another server's parent, its workers not listening yet
        args = ["--port", str(free_port()), "--grpc-port", str(port), "--model-dir", str(tmp_path / "no-models")]
        assert serve.command(args) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"normserve serve: error: gRPC port {port} is already in use by another normserve server (pid {os.getpid()}); "
        "choose another with --grpc-port or NORMSERVE_GRPC_PORT"
    ]


def test_a_runtime_folder_open_to_other_users_is_refused_before_the_workers_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another user could rewrite the workers' model state there: app/server/group.py."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("NORMSERVE_RUNTIME_DIR", str(shared))
    args = ["--port", str(free_port()), "--grpc-port", "0", "--workers", "2", "--model-dir", str(tmp_path / "none")]
    assert serve.command(args) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"normserve serve: error: {shared}: mode 0777, open to other users, not 0700; remove it, or set "
        "NORMSERVE_RUNTIME_DIR to a folder of this user's own"
    ]
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("port", ["-1", "65536"])
def test_a_grpc_port_out_of_range_is_refused(capsys: pytest.CaptureFixture[str], port: str) -> None:
    with pytest.raises(SystemExit) as e:
        serve.command(["--grpc-port", port, "--model-dir", str(MODELS)])
    assert e.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == f"normserve serve: error: --grpc-port must be between 0 and 65535, not {port}"
    )


def test_without_a_manifest_it_exports_first_and_stops_when_the_export_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("")
    model_dir = tmp_path / "a-file" / "models"  # cannot be created: the export fails before exporting anything
    assert serve.command(["--port", str(free_port()), "--grpc-port", "0", "--model-dir", str(model_dir)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"normserve serve: no models in {model_dir}, exporting them first",
        f"normserve export: error: [Errno 20] Not a directory: '{model_dir}'",
    ]
    assert not os.environ.get("NORMSERVE_MODEL_DIR")  # nothing served, nothing handed to workers


def test_serves_the_models_of_its_flags_over_the_environment(tmp_path: Path) -> None:
    (tmp_path / "here").symlink_to(MODELS)  # --model-dir relative to the server's working directory
    port = free_port()
    env = {
        **os.environ,
        "NORMSERVE_HOST": "127.0.0.2",  # the flags win over every one of these
        "NORMSERVE_PORT": str(free_port()),
        "NORMSERVE_MODEL_DIR": str(tmp_path / "nowhere"),
        "NORMSERVE_LOG_LEVEL": "warning",
        "NORMSERVE_GRPC_PORT": "0",  # no gRPC listener on the shared default port
    }
    command = [str(NORMSERVE), "serve", "--host", HOST, "--port", str(port), "--model-dir", "here"]
    with server_process(command, port=port, cwd=tmp_path, env=env, timeout=60) as server:
        meta = httpx.get(f"{server.base}/v2/models/layernorm", timeout=10)
        assert meta.status_code == 200 and meta.json()["name"] == "layernorm"
        answer = httpx.post(f"{server.base}/normalize", json={"data": [[1.0, 3.0]]}, timeout=10).json()
        assert answer["output"][0] == pytest.approx([-1.0, 1.0], abs=1e-5)
