"""`normserve serve`: uvicorn on the models (exporting them first if missing), JSON logs, N workers."""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from pathlib import Path

from app.core.repository import MANIFEST
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


def cannot_listen(host: str, port: int) -> str | None:
    """Why host:port cannot be listened on, or None: known in a moment here, before minutes of export and loading.

    uvicorn binds only after the app has loaded (and a failed bind then follows a `ready` log line), so this
    binds first, as uvicorn will, and lets go at once. Something may still take the port in between.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # uvicorn's choice of family
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a port in TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is already in use; choose another with --port or NORMSERVE_PORT"
            where = "--host or --port (NORMSERVE_HOST, NORMSERVE_PORT)"
            return f"cannot listen on {host}:{port} ({e.strerror}); change {where}"
    return None


def command(argv: list[str]) -> int:
    settings = Settings()
    p = _parser(settings)
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f"--workers must be at least 1, not {args.workers}")
    reason = cannot_listen(args.host, args.port)
    if reason:
        print(f"normserve serve: error: {reason}", file=sys.stderr)
        return 2
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
    import uvicorn

    from app.server import logs, metrics

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
            http="httptools",
        )
    return 0
