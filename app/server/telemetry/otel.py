"""The OpenTelemetry SDK of one worker process, set up from the standard OTEL_* variables; off unless asked for.

On when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set and OTEL_SDK_DISABLED
is not `true`. The SDK itself reads the rest, as every OpenTelemetry SDK does: OTEL_SERVICE_NAME and
OTEL_RESOURCE_ATTRIBUTES (the resource), OTEL_TRACES_SAMPLER(_ARG) (default parentbased_always_on),
OTEL_BSP_* (the batch span processor), OTEL_EXPORTER_OTLP_(TRACES_)HEADERS, _TIMEOUT, _COMPRESSION.
Spans go out over OTLP/HTTP in protobuf. The SDK is imported only when tracing is on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from app import __version__

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SERVICE_NAME = "normserve"  # unless OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) says otherwise


def enabled(env: Mapping[str, str]) -> bool:
    """Whether these variables ask for traces: an OTLP endpoint, and the SDK not disabled."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINTS)


def provider(env: Mapping[str, str]) -> TracerProvider | None:
    """A TracerProvider exporting in batches over OTLP/HTTP, or None when tracing is off.

    The SDK reads os.environ itself: env only decides whether to build one (the lifespan passes os.environ)."""
    if not enabled(env):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME as NAME_KEY
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Each worker process exports on its own: its pid tells them apart in the backend.
    resource = Resource.create({"service.version": __version__, "process.pid": os.getpid()})
    if str(resource.attributes.get(NAME_KEY, "")).startswith("unknown_service"):  # the SDK's default: no name was set
        resource = resource.merge(Resource({NAME_KEY: SERVICE_NAME}))
    traces = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER(_ARG)
    traces.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # endpoint, headers, OTEL_BSP_* from env
    return traces
