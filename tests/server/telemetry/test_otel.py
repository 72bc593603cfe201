"""app/server/telemetry/otel.py: on only with an OTLP endpoint and the SDK not disabled; the resource names the service."""

from __future__ import annotations

import os

import pytest

from app.server.telemetry import otel

ENDPOINT = "http://127.0.0.1:4318"


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ENDPOINT + "/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "false"}, True),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, False),
    ],
)
def test_tracing_is_on_only_with_an_endpoint_and_the_sdk_enabled(env: dict[str, str], on: bool) -> None:
    assert otel.enabled(env) is on
    assert (otel.provider(env) is None) is not on or _shut(otel.provider(env))


def _shut(provider: object) -> bool:
    provider.shutdown()  # type: ignore[attr-defined]
    return True


@pytest.mark.parametrize(("service", "expected"), [(None, "normserve"), ("svc-a", "svc-a")])
def test_the_resource_names_the_service_and_the_worker_process(
    monkeypatch: pytest.MonkeyPatch, service: str | None, expected: str
) -> None:
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    if service is None:
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    else:
        monkeypatch.setenv("OTEL_SERVICE_NAME", service)
    provider = otel.provider({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT})
    assert provider is not None
    try:
        attributes = provider.resource.attributes
        assert attributes["service.name"] == expected and attributes["process.pid"] == os.getpid()
    finally:
        provider.shutdown()
