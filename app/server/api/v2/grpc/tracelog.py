"""The TraceSetting and LogSettings RPCs: Triton's trace and logging extensions over gRPC, as over HTTP.

The same settings as /v2/trace/setting and /v2/logging (app/server/telemetry/tracesettings.py, logsettings.py),
of this worker process, behind the same admin token, read from the `authorization` metadata
(`Bearer <token>`, app/server/api/admin.py): PERMISSION_DENIED when none is configured. A request with
no settings reads them; a setting with no value clears it, as tritonclient sends None.
"""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import service_pb2 as pb

from app.server.api.admin import check_token, grpc_values
from app.server.api.v2.grpc.calls import Call
from app.server.telemetry import logsettings, tracing
from app.server.worker import Worker
from app.settings import Settings


def authorize(context: Any, settings: Settings) -> None:
    check_token(grpc_values(context), settings)


def trace_changes(request: Any) -> dict[str, Any]:
    """{name: [values] or None}: a SettingValue with no values clears the setting."""
    return {key: (list(setting.value) or None) for key, setting in request.settings.items()}


def trace_response(settings: dict[str, Any]) -> Any:
    response = pb.TraceSettingResponse()
    for key, value in settings.items():
        response.settings[key].value.extend(value if isinstance(value, list) else [value])
    return response


def log_changes(request: Any) -> dict[str, Any]:
    """{name: value}: the one field each SettingValue carries (None when it carries none)."""
    changes: dict[str, Any] = {}
    for key, setting in request.settings.items():
        which = setting.WhichOneof("parameter_choice")
        changes[key] = None if which is None else getattr(setting, which)
    return changes


def log_response(settings: dict[str, Any]) -> Any:
    response = pb.LogSettingsResponse()
    for key, value in settings.items():
        if isinstance(value, bool):
            response.settings[key].bool_param = value
        elif isinstance(value, int):
            response.settings[key].uint32_param = value
        else:
            response.settings[key].string_param = value
    return response


class TraceLogRPCs:
    """Mixed into InferenceService: its `worker` gives the model names and the token."""

    worker: Worker

    async def TraceSetting(self, request: Any, context: Any, call: Call) -> Any:  # noqa: N802 (the RPC's name)
        authorize(context, self.worker.settings)
        model = None
        if request.model_name:
            model = call.model = self.worker.plane.model(request.model_name).name
        settings = tracing.STATE.settings
        changes = trace_changes(request)
        return trace_response(settings.update(changes, model) if changes else settings.get(model))

    async def LogSettings(self, request: Any, context: Any, call: Call) -> Any:  # noqa: N802 (the RPC's name)
        authorize(context, self.worker.settings)
        changes = log_changes(request)
        return log_response(logsettings.update(changes) if changes else logsettings.get())
