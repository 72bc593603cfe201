"""app/server/api/health.py: live regardless; ready only once sha256 checks and the parity warm-up pass, else 503."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.live_server import live_server
from tests.repositories import BROKEN, broken_copy, not_ready_reason


def test_ready_and_live_when_models_verified(client: httpx.Client) -> None:
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}


@pytest.mark.parametrize("how", BROKEN)
def test_bad_model_dir_keeps_server_live_but_not_ready(tmp_path: Path, how: str) -> None:
    model_dir = broken_copy(tmp_path, how)
    reason = not_ready_reason(model_dir, how)
    with (
        live_server({"NORMSERVE_MODEL_DIR": str(model_dir)}, wait_ready=False) as base,
        httpx.Client(base_url=base) as c,
    ):
        assert c.get("/v2/health/live").status_code == 200
        for _ in range(100):  # loading runs in the background: wait until it has given up
            r = c.get("/v2/health/ready")
            if "model check failed" in r.text:
                break
            time.sleep(0.05)
        assert r.status_code == 503 and r.json()["error"] == f"not ready: {reason}"
        assert r.headers["retry-after"] == "1"
        broken, working = ("encoder", "layernorm") if how == "missing" else ("layernorm", "encoder")
        inf = c.get(f"/v2/models/{broken}")
        assert inf.status_code == 503 and inf.headers["retry-after"] == "1"
        assert inf.json()["error"] == f"server is not ready: {reason}"
        assert c.get(f"/v2/models/{working}").status_code == 200  # the models that loaded serve


@pytest.mark.parametrize(
    "path",
    ["/v2/health/live", "/v2/health/ready", "/v2", "/v2/models/layernorm", "/v2/models/layernorm/ready"],
)
def test_head_answers_as_get_without_the_body(client: httpx.Client, path: str) -> None:
    """Probes and load balancers send HEAD: the GET's status and headers, no body (uvicorn leaves it out)."""
    got, head = client.get(path), client.head(path)
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-length"] == got.headers["content-length"] == str(len(got.content))
    assert head.headers["content-type"] == got.headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    ("path", "media"),
    [("/metrics", "text/plain"), ("/", "text/html"), ("/docs", "text/html"), ("/openapi.json", "application/json")],
)
def test_head_of_the_other_get_routes_answers_as_get_without_the_body(
    client: httpx.Client, path: str, media: str
) -> None:
    head = client.head(path)
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-type"].startswith(media)


def test_head_of_an_unknown_model_is_its_404_without_the_body(client: httpx.Client) -> None:
    head = client.head("/v2/models/nope/ready")
    assert (head.status_code, head.content) == (404, b"")
    assert head.headers["content-length"] == str(len(client.get("/v2/models/nope/ready").content))
