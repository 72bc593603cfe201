"""`normserve models` (app/cli/models.py): list, load and unload against a live server in explicit mode; migrate."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.repository import Repository
from tests.cli.normserve import closed_port, run
from tests.live_server import MODELS, live_server
from tests.repositories import add_version, copy_models

TOKEN = "cli-token"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_models(tmp_path_factory.mktemp("cli") / "models", ("layernorm",))


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[str]:
    env = {
        "NORMSERVE_MODEL_DIR": str(repository),
        "NORMSERVE_MODEL_CONTROL": "explicit",
        "NORMSERVE_ADMIN_TOKEN": TOKEN,
    }
    with live_server(env) as base:
        yield base


def test_list_load_and_unload_a_version_as_an_operator_would(server: str, repository: Path) -> None:
    auth = {"NORMSERVE_ADMIN_TOKEN": TOKEN}
    assert run("models", "list", "--url", server, env=auth).stdout.splitlines() == [
        "MODEL      VERSION  STATE        REASON",
        "layernorm  1        READY",
    ]
    add_version(repository, "layernorm", 2)
    out = run("models", "load", "layernorm", "--url", server, env=auth)
    assert (out.returncode, out.stdout) == (0, "loaded layernorm: version 2; serving 2\n")
    assert run("models", "list", "--url", server, "--token", TOKEN).stdout.splitlines()[1:] == [
        "layernorm  1        UNAVAILABLE  not selected by the version_policy any more",
        "layernorm  2        READY",
    ]
    out = run("models", "unload", "layernorm", "--url", server, env=auth)
    assert (out.returncode, out.stdout) == (0, "unloaded layernorm: version 2\n")
    assert run("models", "load", "layernorm", "--url", server, env=auth).returncode == 0


@pytest.mark.parametrize(
    ("args", "code", "line"),
    [
        (["list", "--token", "wrong"], 2, "POST {url}/v2/repository/index: HTTP 403: authorization: wrong admin token"),
        (
            ["load", "layernrom", "--token", TOKEN],
            2,
            "POST {url}/v2/repository/models/layernrom/load: HTTP 404: model: no model 'layernrom' in the repository; "
            "available: layernorm",
        ),
        (
            ["unload", "layernrom", "--token", TOKEN],
            2,
            "POST {url}/v2/repository/models/layernrom/unload: HTTP 404: model: no model 'layernrom' in the "
            "repository; available: layernorm",
        ),
        (
            ["load", "../x", "--token", TOKEN],
            2,
            "name: expected a model name matching [A-Za-z0-9][A-Za-z0-9_.-]{{0,63}}, got '../x'",
        ),
    ],
)
def test_errors_are_one_line(server: str, args: list[str], code: int, line: str) -> None:
    out = run("models", *args, "--url", server)
    assert (out.returncode, out.stdout, out.stderr) == (
        code,
        "",
        f"normserve models: error: {line.format(url=server)}\n",
    )


def test_a_failed_load_exits_1_with_the_reason(server: str, repository: Path) -> None:
    folder = add_version(repository, "layernorm", 3)
    (folder / "model.onnx").write_bytes(b"not onnx")
    try:
        out = run("models", "load", "layernorm", "--url", server, "--token", TOKEN)
        assert out.returncode == 1
        assert out.stderr.startswith(
            f"normserve models: error: POST {server}/v2/repository/models/layernorm/load: HTTP 400: failed to load "
            f"model 'layernorm': {folder.relative_to(repository)}/model.onnx: sha256 "
        )
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("how", ["url", "settings"])
def test_an_unreachable_server_exits_2_naming_url(how: str) -> None:
    port = closed_port()
    url = f"http://127.0.0.1:{port}"
    where = ["--url", url] if how == "url" else []
    out = run("models", "list", *where, env={"NORMSERVE_HOST": "127.0.0.1", "NORMSERVE_PORT": str(port)})
    assert (out.returncode, out.stderr) == (
        2,
        f"normserve models: error: cannot reach {url}/v2/repository/index: [Errno 111] Connection refused; give the "
        "server's address with --url (the default is NORMSERVE_HOST and NORMSERVE_PORT)\n",
    )


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_the_server_is_where_serve_listens_by_the_same_settings(server: str, host: str) -> None:
    """NORMSERVE_HOST and NORMSERVE_PORT, as `normserve serve` reads them (a wildcard host is reached on loopback)."""
    port = server.rpartition(":")[2]
    env = {"NORMSERVE_HOST": host, "NORMSERVE_PORT": port, "NORMSERVE_ADMIN_TOKEN": TOKEN}
    out = run("models", "list", env=env)
    assert (out.returncode, out.stderr, out.stdout.splitlines()[0]) == (
        0,
        "",
        "MODEL      VERSION  STATE        REASON",
    )


@pytest.mark.parametrize("action", [["list"], ["load", "layernorm"]])
def test_without_the_token_it_says_to_pass_token(server: str, action: list[str]) -> None:
    out = run("models", *action, "--url", server, env={"NORMSERVE_ADMIN_TOKEN": ""})
    route = "index" if action == ["list"] else "models/layernorm/load"
    assert (out.returncode, out.stdout, out.stderr) == (
        2,
        "",
        f"normserve models: error: POST {server}/v2/repository/{route}: HTTP 401: the server requires its admin "
        "token: pass --token, or set NORMSERVE_ADMIN_TOKEN\n",
    )


def test_migrate_moves_the_old_layout_and_then_has_nothing_to_do(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    manifest = json.loads((MODELS / "layernorm/1/manifest.json").read_text())
    shutil.copyfile(MODELS / "layernorm/1/model.onnx", old / "layernorm.onnx")
    entry = {"kind": "layernorm", "config": {}, "file": "layernorm.onnx", "sha256": manifest["files"]["model.onnx"]}
    (old / "manifest.json").write_text(json.dumps({"format_version": 1, "models": {"layernorm": entry}}))
    out = run("models", "migrate", "--repository", str(old))
    assert (out.returncode, out.stdout) == (0, f"migrated {old}: layernorm/1\n")
    assert Repository(old).versions("layernorm") == [1]
    out = run("models", "migrate", "--repository", str(old))
    assert (out.returncode, out.stdout) == (0, f"{old} is already a model repository: nothing to migrate\n")
