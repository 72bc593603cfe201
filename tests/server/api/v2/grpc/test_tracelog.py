"""app/server/api/v2/grpc/tracelog.py: the TraceSetting and LogSettings RPCs with the official tritonclient.grpc, the admin
token from the `authorization` metadata, and the same settings HTTP's /v2/trace/setting and /v2/logging show.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from tests.server.api.v2.grpc.live import GrpcServer, grpc_server
from tests.server.otlp_receiver import otlp_receiver, tracing_env

TOKEN = "grpc-admin"
AUTH = {"authorization": f"Bearer {TOKEN}"}
TRACE_KEYS = ("trace_level", "trace_rate", "trace_count")


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    with otlp_receiver() as rx:
        env = {**tracing_env(rx), "NORMSERVE_ADMIN_TOKEN": TOKEN}
        with grpc_server(tmp_path_factory.mktemp("grpc-control"), env) as server:
            yield server


@pytest.fixture
def client(admin: GrpcServer) -> Iterator[tg.InferenceServerClient]:
    """tritonclient.grpc; the settings are put back to their defaults after each test."""
    triton = tg.InferenceServerClient(admin.address)
    yield triton
    triton.update_trace_settings("layernorm", {k: None for k in TRACE_KEYS}, headers=AUTH)
    triton.update_trace_settings(settings={k: None for k in TRACE_KEYS}, headers=AUTH)
    triton.update_log_settings({"log_info": True, "log_verbose_level": 0}, headers=AUTH)
    triton.close()


def test_server_metadata_lists_trace_and_logging(client: tg.InferenceServerClient) -> None:
    assert {"trace", "logging"} <= set(client.get_server_metadata().extensions)


def test_trace_settings_round_trip_and_match_http(admin: GrpcServer, client: tg.InferenceServerClient) -> None:
    default = client.get_trace_settings(headers=AUTH, as_json=True)["settings"]
    assert {k: default[k]["value"] for k in TRACE_KEYS} == {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": ["1"],
        "trace_count": ["-1"],
    }
    client.update_trace_settings(settings={"trace_rate": "4"}, headers=AUTH)
    model = client.update_trace_settings("layernorm", {"trace_level": ["OFF"]}, headers=AUTH, as_json=True)
    assert model["settings"]["trace_level"]["value"] == ["OFF"] and model["settings"]["trace_rate"]["value"] == ["4"]
    http = httpx.get(admin.base + "/v2/models/layernorm/trace/setting", headers=AUTH).json()
    assert http["trace_level"] == ["OFF"] and http["trace_rate"] == "4"
    cleared = client.update_trace_settings("layernorm", {"trace_level": None}, headers=AUTH, as_json=True)
    assert cleared["settings"]["trace_level"]["value"] == ["TIMESTAMPS"]


def test_log_settings_round_trip_and_match_http(admin: GrpcServer, client: tg.InferenceServerClient) -> None:
    settings = client.get_log_settings(headers=AUTH, as_json=True)["settings"]
    assert settings["log_info"] == {"bool_param": True} and settings["log_format"] == {"string_param": "ISO8601"}
    updated = client.update_log_settings({"log_verbose_level": 1}, headers=AUTH, as_json=True)["settings"]
    assert updated["log_verbose_level"] == {"uint32_param": 1}
    assert httpx.get(admin.base + "/v2/logging", headers=AUTH).json()["log_verbose_level"] == 1


def test_verbose_logging_turns_on_alone_on_a_server_at_warning(
    admin: GrpcServer, client: tg.InferenceServerClient
) -> None:
    """As in Triton, log_verbose_level needs no log_info."""
    client.update_log_settings({"log_info": False}, headers=AUTH)
    updated = client.update_log_settings({"log_verbose_level": 1}, headers=AUTH, as_json=True)["settings"]
    switches = ("log_verbose_level", "log_info", "log_warning", "log_error")
    assert [updated[k] for k in switches] == [
        {"uint32_param": 1},
        {"bool_param": False},
        {"bool_param": True},
        {"bool_param": True},
    ]
    http = httpx.get(admin.base + "/v2/logging", headers=AUTH).json()
    assert [http[k] for k in switches] == [1, False, True, True]


@pytest.mark.parametrize(
    ("headers", "code", "message"),
    [
        (
            {},
            "StatusCode.UNAUTHENTICATED",
            "authorization: expected `Authorization: Bearer <token>` (NORMSERVE_ADMIN_TOKEN is set)",
        ),
        ({"authorization": "Bearer wrong"}, "StatusCode.PERMISSION_DENIED", "authorization: wrong admin token"),
    ],
    ids=["no-token", "wrong-token"],
)
@pytest.mark.parametrize("rpc", ["get_trace_settings", "get_log_settings", "update_log_settings"])
def test_a_missing_or_wrong_token_is_refused(
    client: tg.InferenceServerClient, headers: dict[str, str], code: str, message: str, rpc: str
) -> None:
    args = ({"log_info": False},) if rpc == "update_log_settings" else ()
    with pytest.raises(InferenceServerException) as e:
        getattr(client, rpc)(*args, headers=headers)
    assert (e.value.status(), e.value.message()) == (code, message)
    assert client.get_log_settings(headers=AUTH, as_json=True)["settings"]["log_info"] == {"bool_param": True}


def test_a_bad_setting_is_invalid_argument(client: tg.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as e:
        client.update_trace_settings(settings={"trace_level": ["TENSORS"]}, headers=AUTH)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert (
        e.value.message()
        == "trace_level: expected ['OFF'] or ['TIMESTAMPS'] (TENSORS is not supported), got ['TENSORS']"
    )
