"""The admin surface (repository index, load, unload, trace and logging settings; HTTP and gRPC) is closed by
default, and a configured token is read as a Secret holds it and demanded once per request on every route."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from benchmarks.servers import free_port
from tests.live_server import ROOT, server_env
from tests.server.api.v2.grpc.live import GrpcServer, grpc_server

TOKEN = "tok-3f9a"
CLOSED = "authorization: the admin routes are closed: set NORMSERVE_ADMIN_TOKEN on the server to open them"
TWICE = "authorization: 2 authorization values; expected `Authorization: Bearer <token>` (NORMSERVE_ADMIN_TOKEN is set)"
HTTP_ROUTES = [
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/layernorm/load"),
    ("POST", "/v2/repository/models/layernorm/unload"),
    ("GET", "/v2/trace/setting"),
    ("POST", "/v2/trace/setting"),
    ("GET", "/v2/models/layernorm/trace/setting"),
    ("POST", "/v2/models/layernorm/trace/setting"),
    ("GET", "/v2/logging"),
    ("POST", "/v2/logging"),
]
RPCS: list[tuple[str, Any]] = [
    ("RepositoryIndex", pb.RepositoryIndexRequest()),
    ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="layernorm")),
    ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="layernorm")),
    ("TraceSetting", pb.TraceSettingRequest()),
    ("LogSettings", pb.LogSettingsRequest(settings={"log_info": pb.LogSettingsRequest.SettingValue(bool_param=False)})),
]
WARNING = (
    "NORMSERVE_MODEL_CONTROL is explicit but NORMSERVE_ADMIN_TOKEN is not set: the repository API (load, unload) "
    "and the trace and logging routes are closed until a token is set"
)


@pytest.fixture(scope="module")
def closed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    """Explicit model control and no token: the mode whose whole point is the admin routes."""
    env = {"NORMSERVE_MODEL_CONTROL": "explicit", "NORMSERVE_ADMIN_TOKEN": ""}
    with grpc_server(tmp_path_factory.mktemp("closed"), env) as server:
        yield server


@pytest.fixture(scope="module")
def closed_none(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    """The default model control (none) and no token: a load or unload would be refused by the mode too."""
    env = {"NORMSERVE_MODEL_CONTROL": "none", "NORMSERVE_ADMIN_TOKEN": ""}
    with grpc_server(tmp_path_factory.mktemp("closed-none"), env) as server:
        yield server


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    """The token as a Kubernetes Secret made from a file holds it: with its trailing newline."""
    env = {"NORMSERVE_MODEL_CONTROL": "explicit", "NORMSERVE_ADMIN_TOKEN": f"{TOKEN}\n"}
    with grpc_server(tmp_path_factory.mktemp("guarded"), env) as server:
        yield server


def _call(server: GrpcServer, rpc: str, request: Any, metadata: list[tuple[str, str]]) -> grpc.RpcError:
    with grpc.insecure_channel(server.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            getattr(stub, rpc)(request, metadata=metadata, timeout=30)
    return e.value


@pytest.mark.parametrize(("method", "path"), HTTP_ROUTES, ids=[f"{m} {p}" for m, p in HTTP_ROUTES])
@pytest.mark.parametrize("auth", [None, f"Bearer {TOKEN}"], ids=["no-header", "a-token"])
def test_without_a_configured_token_every_admin_route_is_403_naming_the_setting(
    closed: GrpcServer, method: str, path: str, auth: str | None
) -> None:
    headers = {"Authorization": auth} if auth else {}
    r = httpx.request(method, closed.base + path, headers=headers, json={}, timeout=30)
    assert (r.status_code, r.json()) == (403, {"error": CLOSED})


@pytest.mark.parametrize(("rpc", "request_"), RPCS, ids=[rpc for rpc, _ in RPCS])
def test_without_a_configured_token_every_admin_rpc_is_permission_denied(
    closed: GrpcServer, rpc: str, request_: Any
) -> None:
    error = _call(closed, rpc, request_, [("authorization", f"Bearer {TOKEN}")])
    assert (error.code(), error.details()) == (grpc.StatusCode.PERMISSION_DENIED, CLOSED)


# In mode none a closed load or unload names both settings it needs: the token, then the mode, would be two tries.
CLOSED_NONE = [
    ("/v2/repository/index", "RepositoryIndex", CLOSED),
    (
        "/v2/repository/models/layernorm/load",
        "RepositoryModelLoad",
        f"{CLOSED}; to load models, NORMSERVE_MODEL_CONTROL=explicit as well (it is 'none')",
    ),
    (
        "/v2/repository/models/layernorm/unload",
        "RepositoryModelUnload",
        f"{CLOSED}; to unload models, NORMSERVE_MODEL_CONTROL=explicit as well (it is 'none')",
    ),
]


@pytest.mark.parametrize(("path", "rpc", "message"), CLOSED_NONE, ids=[rpc for _, rpc, _ in CLOSED_NONE])
def test_in_mode_none_a_closed_load_or_unload_names_the_token_and_the_mode(
    closed_none: GrpcServer, path: str, rpc: str, message: str
) -> None:
    r = httpx.post(closed_none.base + path, headers={"Authorization": f"Bearer {TOKEN}"}, json={}, timeout=30)
    assert (r.status_code, r.json()) == (403, {"error": message})
    request_ = dict(RPCS)[rpc]
    error = _call(closed_none, rpc, request_, [("authorization", f"Bearer {TOKEN}")])
    assert (error.code(), error.details()) == (grpc.StatusCode.PERMISSION_DENIED, message)


def test_a_closed_server_warns_at_start_and_goes_on_serving_every_model(closed: GrpcServer) -> None:
    warnings = [d["msg"] for d in closed.log_lines() if d["level"] == "warning"]
    assert warnings == [WARNING]
    for _ in HTTP_ROUTES:  # the refused unloads and log-level changes changed nothing
        httpx.post(f"{closed.base}/v2/repository/models/layernorm/unload", timeout=30)
    assert httpx.get(f"{closed.base}/v2/health/ready", timeout=30).status_code == 200
    r = httpx.post(f"{closed.base}/normalize", json={"data": [1.0, 3.0]}, timeout=30)
    assert (r.status_code, r.json()["output"]) == (200, pytest.approx([-1.0, 1.0], abs=1e-4))


def test_a_token_from_a_secret_file_is_read_without_its_newline(guarded: GrpcServer) -> None:
    r = httpx.post(f"{guarded.base}/v2/repository/index", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert r.status_code == 200 and {row["name"] for row in r.json()} == {"encoder", "encoder-preln", "layernorm"}
    assert not [d for d in guarded.log_lines() if d["level"] == "warning"]


@pytest.mark.parametrize(("method", "path"), HTTP_ROUTES, ids=[f"{m} {p}" for m, p in HTTP_ROUTES])
def test_two_authorization_headers_are_refused_on_every_route(guarded: GrpcServer, method: str, path: str) -> None:
    headers = [("Authorization", f"Bearer {TOKEN}"), ("Authorization", f"Bearer {TOKEN}")]
    r = httpx.request(method, guarded.base + path, headers=headers, json={}, timeout=30)
    assert (r.status_code, r.json()) == (401, {"error": TWICE})


@pytest.mark.parametrize(("rpc", "request_"), RPCS, ids=[rpc for rpc, _ in RPCS])
@pytest.mark.parametrize("second", ["Bearer wrong", f"Bearer {TOKEN}"], ids=["wrong-second", "same-twice"])
def test_two_authorization_metadata_are_refused_on_every_rpc(
    guarded: GrpcServer, rpc: str, request_: Any, second: str
) -> None:
    error = _call(guarded, rpc, request_, [("authorization", f"Bearer {TOKEN}"), ("authorization", second)])
    assert (error.code(), error.details()) == (grpc.StatusCode.UNAUTHENTICATED, TWICE)


@pytest.mark.parametrize("token", ["two words", "tök", "a\tb"], ids=["space", "non-ascii", "tab"])
def test_a_token_that_is_not_printable_ascii_stops_the_start_with_a_clear_error(token: str) -> None:
    # This checkout's command (the venv's `normserve` script imports the checkout the venv was installed from),
    # on a free port: were the token taken, it would serve until the timeout rather than on a fixed port.
    env = server_env({"NORMSERVE_ADMIN_TOKEN": token, "NORMSERVE_PORT": str(free_port()), "PYTHONPATH": str(ROOT)})
    command = [sys.executable, "-m", "app.cli.main", "serve"]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert (proc.returncode, proc.stderr) == (
        2,
        "normserve serve: error: NORMSERVE_ADMIN_TOKEN: Value error, NORMSERVE_ADMIN_TOKEN must be printable ASCII "
        "without spaces or control characters inside (a bearer token); the value set is not\n",
    )
