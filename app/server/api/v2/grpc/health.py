"""grpc.health.v1.Health: SERVING when the worker is ready and not draining, NOT_SERVING otherwise.

The answer is read from the worker's Admission at each Check, so it turns NOT_SERVING the moment
SIGTERM marks the worker draining (app/server/drain.py), with no status to keep in step. Kubernetes'
`grpc:` probe and grpc_health_probe ask for the server ("") or a service by name.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from app.server.admission import Admission
from app.server.api.v2.grpc.calls import Call

SERVICE = "grpc.health.v1.Health"
INFERENCE = "inference.GRPCInferenceService"
KNOWN = ("", INFERENCE)  # "" is the whole server
WATCH_POLL_S = 0.05  # how soon a Watch stream sees a change of readiness
Status = health_pb2.HealthCheckResponse.ServingStatus


class HealthService:
    """Check and Watch on the worker's admission; `close()` ends the Watch streams (shutdown)."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.closing = asyncio.Event()

    def status(self, service: str) -> int:
        if service not in KNOWN:
            return int(Status.SERVICE_UNKNOWN)
        return int(Status.SERVING if self.admission.accepting else Status.NOT_SERVING)

    async def Check(self, request: Any, context: Any, call: Call) -> Any:
        if request.service not in KNOWN:  # as the health protocol says: NOT_FOUND for an unknown service
            known = ", ".join(repr(s) for s in KNOWN)
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}; known: {known}")
        return health_pb2.HealthCheckResponse(status=self.status(request.service))

    async def Watch(self, request: Any, context: Any, call: Call) -> AsyncIterator[Any]:
        """The status now, then each change (SERVICE_UNKNOWN for an unknown service, as the protocol says)."""
        last = None
        while not self.closing.is_set():
            status = self.status(request.service)
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.closing.wait(), WATCH_POLL_S)

    def close(self) -> None:
        self.closing.set()
