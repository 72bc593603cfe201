"""app/server/api/v2/http/repository.py against a live server: tritonclient's repository and config calls, the token,
the modes, and names that must not reach the file system."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as th

from tests.live_server import live_server
from tests.repositories import add_version, copy_models, learned_layernorm
from tests.triton_clients import TritonOn

TOKEN = "repo-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TRITON = TritonOn("explicit", "http", {"network_timeout": 120})  # tests/conftest.py's `triton`, on this server


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = copy_models(tmp_path_factory.mktemp("repo") / "models", ("layernorm", "encoder"))
    rng = np.random.default_rng(3)
    learned_layernorm(root, "my-ln", 1, 1 + rng.standard_normal((4,)), rng.standard_normal((4,)))
    return root


@pytest.fixture(scope="module")
def explicit(repository: Path) -> Iterator[str]:
    """explicit mode with a token; my-ln is in the repository but not loaded at start."""
    env = {
        "NORMSERVE_MODEL_DIR": str(repository),
        "NORMSERVE_MODEL_CONTROL": "explicit",
        "NORMSERVE_STARTUP_MODELS": "layernorm,encoder",
        "NORMSERVE_ADMIN_TOKEN": TOKEN,
    }
    with live_server(env) as base:
        yield base


def test_tritonclient_loads_unloads_and_lists_with_the_token(
    triton: th.InferenceServerClient, repository: Path
) -> None:
    assert {(m["name"], m["version"], m["state"]) for m in triton.get_model_repository_index(headers=AUTH)} == {
        ("encoder", "1", "READY"),
        ("layernorm", "1", "READY"),
        ("my-ln", "1", "UNAVAILABLE"),
    }
    assert not triton.is_model_ready("my-ln")
    triton.load_model("my-ln", headers=AUTH)
    assert triton.is_model_ready("my-ln") and triton.is_model_ready("my-ln", "1")
    assert not triton.is_model_ready("my-ln", "2")
    config = triton.get_model_config("my-ln")
    assert [(i["name"], i["dims"], i["optional"]) for i in config["input"]] == [
        ("input", [-1, 4], False),
        ("gamma", [4], True),
        ("beta", [4], True),
    ]
    triton.unload_model("my-ln", headers=AUTH)
    assert not triton.is_model_ready("my-ln")
    index = {
        (m["name"], m["version"]): (m["state"], m["reason"]) for m in triton.get_model_repository_index(headers=AUTH)
    }
    assert index["my-ln", "1"] == ("UNAVAILABLE", "unloaded")


def test_versions_answer_on_their_own_routes(triton: th.InferenceServerClient, repository: Path) -> None:
    add_version(repository, "layernorm", 2)
    (repository / "layernorm/model.json").write_text(json.dumps({"version_policy": {"all": {}}}))
    try:
        triton.load_model("layernorm", headers=AUTH)
        assert triton.is_model_ready("layernorm", "1") and triton.is_model_ready("layernorm", "2")
        assert triton.get_model_config("layernorm", "2")["version_policy"] == {"all": {}}
        x = np.array([[1.0, 2.0, 4.0]], np.float32)
        for version in ("1", "2", ""):
            inp = th.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            result = triton.infer("layernorm", [inp], model_version=version).get_response()
            assert result["model_version"] == (version or "2")  # no version: the highest ready one
    finally:
        (repository / "layernorm/model.json").write_text(
            json.dumps({"version_policy": {"specific": {"versions": [1]}}})
        )
        triton.load_model("layernorm", headers=AUTH)
    assert not triton.is_model_ready("layernorm", "2")


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({}, 401, "authorization: expected `Authorization: Bearer <token>` (NORMSERVE_ADMIN_TOKEN is set)"),
        ({"Authorization": "Bearer nope"}, 403, "authorization: wrong admin token"),
        ({"Authorization": "Basic cmVwbzp0b2tlbg=="}, 401, None),
    ],
)
@pytest.mark.parametrize(
    "path", ["/v2/repository/index", "/v2/repository/models/layernorm/load", "/v2/repository/models/layernorm/unload"]
)
def test_the_admin_token_guards_every_repository_route(
    explicit: str, path: str, headers: dict[str, str], status: int, message: str | None
) -> None:
    r = httpx.post(explicit + path, headers=headers)
    assert r.status_code == status
    if message is not None:
        assert r.json() == {"error": message}
    if status == 401:
        assert r.headers["www-authenticate"] == 'Bearer realm="normserve"'


@pytest.mark.parametrize(
    ("header", "status", "message"),
    [
        (b"Bearer repo-token\xa0", 403, "authorization: wrong admin token"),
        (b"Bearer repo-token\x85", 403, "authorization: wrong admin token"),
        (b"Bearer \xa0repo-token", 403, "authorization: wrong admin token"),
        (
            b"\xa0Bearer repo-token",
            401,
            "authorization: expected `Authorization: Bearer <token>` (NORMSERVE_ADMIN_TOKEN is set)",
        ),
        (b"Bearer \trepo-token", 200, None),
    ],
    ids=["nbsp-after", "nel-after", "nbsp-before", "nbsp-first", "tab-before"],
)
def test_only_ascii_whitespace_may_surround_the_admin_token(
    explicit: str, header: bytes, status: int, message: str | None
) -> None:
    r = httpx.post(explicit + "/v2/repository/index", headers={"Authorization": header})
    assert r.status_code == status
    if message is not None:
        assert r.json() == {"error": message}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (
            {"parameters": {"config": "{}"}},
            400,
            "config: not supported; the repository folder is what loads (accepted: none)",
        ),
        ({"parameters": []}, 400, "parameters: expected an object, got []"),
        ([1], 400, "body: expected a JSON object, got [1]"),
    ],
)
def test_a_load_body_is_an_object_of_supported_parameters(explicit: str, body: Any, status: int, message: str) -> None:
    r = httpx.post(explicit + "/v2/repository/models/layernorm/load", json=body, headers=AUTH)
    assert (r.status_code, r.json()) == (status, {"error": message})


HOSTILE = ["..", "...", "%2e%2e", "..%2f..%2fetc", "%2fetc%2fpasswd", "a" * 10_000, ".hidden", "-rf", "%00"]


@pytest.mark.parametrize("name", HOSTILE, ids=lambda n: n[:12])
@pytest.mark.parametrize(
    ("method", "route"),
    [
        ("POST", "/v2/repository/models/{}/load"),
        ("POST", "/v2/repository/models/{}/unload"),
        ("GET", "/v2/models/{}"),
        ("GET", "/v2/models/{}/config"),
        ("GET", "/v2/models/{}/ready"),
        ("GET", "/v2/models/{}/versions/1/stats"),
        ("POST", "/v2/models/{}/infer"),
    ],
)
def test_hostile_names_get_a_4xx_and_touch_nothing(
    explicit: str, repository: Path, method: str, route: str, name: str
) -> None:
    before = sorted(p.relative_to(repository.parent) for p in repository.parent.rglob("*"))
    # http.client sends the path as written: httpx would resolve the dot segments before the server saw them.
    conn = http.client.HTTPConnection(*explicit.removeprefix("http://").split(":"), timeout=30)
    conn.request(
        method, route.format(name), body=b'{"inputs": []}', headers={**AUTH, "Content-Type": "application/json"}
    )
    status = conn.getresponse().status
    conn.close()
    assert 400 <= status < 500
    assert sorted(p.relative_to(repository.parent) for p in repository.parent.rglob("*")) == before


@pytest.mark.parametrize("version", ["0", "-1", "1e9", "01", "%2e%2e", "99999999999"])
@pytest.mark.parametrize("route", ["/v2/models/layernorm/versions/{}", "/v2/models/layernorm/versions/{}/config"])
def test_versions_that_are_not_positive_integers_get_400(explicit: str, route: str, version: str) -> None:
    r = httpx.get(explicit + route.format(version))
    assert r.status_code == 400
    assert r.json()["error"].startswith("version: expected a positive integer version (1..2147483647), got ")


def test_a_rest_request_names_its_model_and_version(explicit: str) -> None:
    ok = httpx.post(explicit + "/normalize", json={"data": [[1.0, 2.0, 4.0]], "model": "layernorm", "version": 1})
    assert ok.status_code == 200 and ok.json()["model"]["version"] == "1"
    for body, status, error in [
        ({"model": "encoder"}, 422, "model: 'encoder' is of kind encoder; /normalize takes a layernorm model"),
        ({"version": 7}, 404, "version: model 'layernorm' has no ready version 7; ready: 1"),
        ({"version": "1e9"}, 422, "version: expected a positive integer version (1..2147483647), got '1e9'"),
        (
            {"model": "../etc"},
            422,
            "model: expected a model name matching [A-Za-z0-9][A-Za-z0-9_.-]{0,63}, got '../etc'",
        ),
    ]:
        r = httpx.post(explicit + "/normalize", json={"data": [[1.0, 2.0]], **body})
        assert (r.status_code, r.json()) == (status, {"error": error})


def test_outside_explicit_mode_load_and_unload_are_403_naming_the_setting() -> None:
    with live_server({"NORMSERVE_ADMIN_TOKEN": TOKEN}) as base:
        for action in ("load", "unload"):
            r = httpx.post(f"{base}/v2/repository/models/layernorm/{action}", headers=AUTH)
            assert (r.status_code, r.json()["error"]) == (
                403,
                f"cannot {action} model 'layernorm': NORMSERVE_MODEL_CONTROL is 'none'; the repository API loads "
                "and unloads models only with NORMSERVE_MODEL_CONTROL=explicit",
            )
        index = httpx.post(f"{base}/v2/repository/index", headers=AUTH)  # reading the index is not control
        assert index.status_code == 200 and {e["state"] for e in index.json()} == {"READY"}
        assert httpx.get(f"{base}/v2/").json() == httpx.get(f"{base}/v2").json()
