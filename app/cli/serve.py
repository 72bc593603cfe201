"""`normserve serve`: uvicorn on the models (exporting them first if missing), JSON logs, N workers."""

from __future__ import annotations

import argparse
import errno
import math
import os
import socket
import sys
from contextlib import nullcontext
from pathlib import Path

from app.core.repository import MANIFEST
from app.server import group
from app.settings import Settings


def _parser(settings: Settings) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="normserve serve",
        description="Serve the models with uvicorn (exporting them first if missing). Logs are JSON lines on stderr.",
        epilog="Every NORMSERVE_* setting applies (README). With --workers > 1, /metrics sums all workers: "
        "PROMETHEUS_MULTIPROC_DIR is set to a fresh temporary directory unless already set (then emptied of *.db).",
    )
    p.add_argument("--host", default=settings.host, help=f"address to bind (NORMSERVE_HOST, default {settings.host})")
    p.add_argument("--port", type=int, default=settings.port, help=f"port (NORMSERVE_PORT, default {settings.port})")
    p.add_argument(
        "--grpc-port",
        type=int,
        default=settings.grpc_port,
        help=f"gRPC port, 0 = no gRPC (NORMSERVE_GRPC_PORT, default {settings.grpc_port})",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=settings.workers,
        help=f"worker processes (NORMSERVE_WORKERS, default {settings.workers})",
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        default=settings.model_dir,
        help=f"models (NORMSERVE_MODEL_DIR, default {settings.model_dir})",
    )
    return p


def cannot_listen(
    host: str, port: int, what: str = "port", option: str = "--port", variable: str = "NORMSERVE_PORT"
) -> str | None:
    """Why host:port cannot be listened on, or None: known in a moment here, before minutes of export and loading.

    uvicorn binds only after the app has loaded (and a failed bind then follows a `ready` log line), so this
    binds first, as uvicorn will, and lets go at once. Something may still take the port in between. Without
    SO_REUSEPORT, the bind also fails on a port that another server's gRPC workers share.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # uvicorn's choice of family
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a port in TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"{what} {port} on {host} is already in use; choose another with {option} or {variable}"
            where = f"--host or {option} (NORMSERVE_HOST, {variable})"
            return f"cannot listen on {host}:{port} ({e.strerror}); change {where}"
    return None


def _busy(args: argparse.Namespace) -> str | None:
    """Why the HTTP or the gRPC port cannot be served, or None."""
    if reason := cannot_listen(args.host, args.port):
        return reason
    if args.grpc_port == 0:
        return None
    return cannot_listen(args.host, args.grpc_port, "gRPC port", "--grpc-port", "NORMSERVE_GRPC_PORT")


def command(argv: list[str]) -> int:
    settings = Settings()
    p = _parser(settings)
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f"--workers must be at least 1, not {args.workers}")
    if args.grpc_port < 0 or args.grpc_port > 65535:
        p.error(f"--grpc-port must be between 0 and 65535, not {args.grpc_port}")
    reason = _busy(args)
    try:  # held while the workers run, so that a worker restarted later still finds the port this server's
        claim = group.claim_grpc_port(args.grpc_port) if args.grpc_port and not reason else None
    except group.PortTaken as e:
        reason = str(e)
    if reason:
        print(f"normserve serve: error: {reason}", file=sys.stderr)
        return 2
    with claim or nullcontext():
        return _serve(args, settings)


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    # An empty or missing repository gets the default models; the old layout is the server's to refuse.
    legacy = (args.model_dir / MANIFEST).is_file()
    if not legacy and not any(args.model_dir.glob(f"*/*/{MANIFEST}")):
        from app.cli.main import export

        print(f"normserve serve: no models in {args.model_dir}, exporting them first", file=sys.stderr)
        code = export(["--out-dir", str(args.model_dir)])
        if code:
            return code
    # Workers are separate processes that build their own Settings: hand the choices over by environment.
    os.environ["NORMSERVE_MODEL_DIR"] = str(args.model_dir.resolve())
    os.environ["NORMSERVE_HOST"] = args.host  # gRPC listens there too
    os.environ["NORMSERVE_GRPC_PORT"] = str(args.grpc_port)
    import uvicorn

    from app.server.http import heads
    from app.server.telemetry import logs, metrics

    with metrics.multiprocess_dir_for(args.workers):  # before the workers start: they read it as they import
        uvicorn.run(
            "app.main:app",
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_level=settings.log_level.lower(),
            log_config=logs.uvicorn_log_config(settings.log_level),
            access_log=False,  # normserve.access logs each request (JSON, with its id, route and model)
            loop="uvloop",
            http=heads.PROTOCOL,  # httptools, guarded: head deadline and size, connection limit
            # The drain then bounds it by what is left of the drain timeout (app/server/drain.py).
            timeout_graceful_shutdown=math.ceil(settings.drain_timeout_s),  # uvicorn takes whole seconds
        )
    return 0
