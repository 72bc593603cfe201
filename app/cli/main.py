"""The `normserve` command: export, serve, validate (bench lives in scripts/bench.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from app.settings import Settings


def _export(argv: list[str]) -> int:
    try:
        from app.export.exporter import main as export_main
    except ImportError as e:  # torch and onnx are the `export` extra, absent from the runtime image
        print(
            f"normserve export: needs the export extra ({e.name} missing): pip install 'normserve[export]'",
            file=sys.stderr,
        )
        return 2
    from app.cli.console import Steps

    with Steps("export") as step:
        return export_main(argv, progress=step)


def _serve(argv: list[str]) -> int:
    settings = Settings()
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
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f"--workers must be at least 1, not {args.workers}")
    if not (args.model_dir / "manifest.json").is_file():
        print(f"normserve serve: no models in {args.model_dir}, exporting them first", file=sys.stderr)
        code = _export(["--out-dir", str(args.model_dir)])
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


def _validate(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="normserve validate",
        description="Check every model against the NumPy reference and print a parity table: in process "
        "(sha256 checks and the start-up parity warm-up), or against a running server with --url.",
        epilog="Exit status: 0 when every check passes, 1 when one fails, 2 when they cannot run "
        "(no models, unreachable server, unexpected answer).",
    )
    p.add_argument("--url", help="base URL of a running server, e.g. http://127.0.0.1:8000 (default: in process)")
    p.add_argument("--model-dir", type=Path, default=Settings().model_dir, help="models to check in process")
    p.add_argument(
        "--atol",
        type=float,
        help="one tolerance for every check (default: each check's own: 1e-5 x max(1, |gamma|) "
        "plus half a float32 ulp for layernorm, NORMSERVE_VALIDATE_ATOL for the encoders)",
    )
    args = p.parse_args(argv)
    from app.cli import console, validate
    from app.core.runtime import ModelLoadError

    checks: list[validate.Check] = []
    try:
        plan = (
            validate.remote_plan(args.url, args.atol)
            if args.url
            else validate.in_process_plan(args.model_dir, args.atol)
        )
        with console.Steps("validate", total=len(plan)) as step:
            for description, run in plan:
                step(description)
                checks += run()
    except validate.ValidateError as e:
        print(f"normserve validate: error: {e}", file=sys.stderr)
        return 2
    except ModelLoadError as e:  # the warm-up stops at a model past its own tolerance
        print(f"normserve validate: FAIL: {e}", file=sys.stderr)
        return 1
    failed = sum(not c.passed for c in checks)
    console.stdout.print(console.parity_table(checks, f"parity against NumPy: {args.url or args.model_dir}"))
    console.stdout.print(f"{failed} of {len(checks)} checks failed" if failed else f"all {len(checks)} checks passed")
    return 1 if failed else 0


def _bench(argv: list[str]) -> int:
    """scripts/bench.py's main: the suite lives in the checkout (benchmarks/), not in the installed package."""
    import importlib.util

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench.py"
    spec = importlib.util.spec_from_file_location("normserve_bench", script)
    if not script.is_file() or spec is None or spec.loader is None:
        print(f"normserve bench: {script} not found; run it from a checkout of normserve", file=sys.stderr)
        return 2
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    code: int = module.main(argv)
    return code


COMMANDS = {"export": _export, "serve": _serve, "validate": _validate, "bench": _bench}


USAGE = """usage: normserve {export,serve,validate,bench} [--help]

  export    export the models to ONNX with manifest.json and parity figures
  serve     serve /normalize, /encode and the V2 protocol (exports first if needed)
  validate  run every model against the NumPy reference and print a parity table
  bench     measure in process and over HTTP beside two peers; write docs/benchmarks.md (--quick: < 3 min)

`normserve <command> --help` describes each command's options."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if not argv or argv[0] not in COMMANDS:
        what = f"unknown command {argv[0]!r}" if argv else "a command is required"
        print(f"normserve: error: {what} (see normserve --help)", file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]](argv[1:])
    except ValidationError as e:  # a NORMSERVE_* variable that does not parse: name it, no traceback
        err = e.errors()[0]
        name = "NORMSERVE_" + "_".join(str(part) for part in err["loc"]).upper()
        print(f"normserve {argv[0]}: error: {name}: {err['msg']}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
