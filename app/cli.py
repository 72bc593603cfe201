"""The `normserve` command: export, serve, validate (bench lives in scripts/bench.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

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
    return export_main(argv)


def _serve(argv: list[str]) -> int:
    settings = Settings()
    p = argparse.ArgumentParser(
        prog="normserve serve", description="Serve the models with uvicorn (exporting them first if missing)."
    )
    p.add_argument("--host", default=settings.host)
    p.add_argument("--port", type=int, default=settings.port)
    p.add_argument("--workers", type=int, default=settings.workers)
    p.add_argument("--model-dir", type=Path, default=settings.model_dir)
    args = p.parse_args(argv)
    if not (args.model_dir / "manifest.json").is_file():
        print(f"normserve serve: no models in {args.model_dir}, exporting them first", file=sys.stderr)
        code = _export(["--out-dir", str(args.model_dir)])
        if code:
            return code
    # Workers are separate processes that build their own Settings: hand the choices over by environment.
    os.environ["NORMSERVE_MODEL_DIR"] = str(args.model_dir.resolve())
    import uvicorn

    uvicorn.run(
        "app.main:app",
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=settings.log_level.lower(),
        loop="uvloop",
        http="httptools",
    )
    return 0


def _validate(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="normserve validate", description="Check every model against the NumPy reference.")
    p.add_argument("--model-dir", type=Path, default=Settings().model_dir)
    args = p.parse_args(argv)
    from app import dataplane
    from app.runtime import ModelLoadError, Runtime

    runtime = Runtime(Settings(model_dir=args.model_dir))
    try:
        runtime.load()
        figures = dataplane.warm_up(runtime)
    except ModelLoadError as e:
        print(f"normserve validate: {e}", file=sys.stderr)
        return 1
    print(f"{'model':<16}{'max abs diff':>14}  sha256")
    for name, diff in figures.items():
        print(f"{name:<16}{diff:>14.2e}  {runtime.models[name].sha256[:16]}")
    return 0


COMMANDS = {"export": _export, "serve": _serve, "validate": _validate}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(
            "usage: normserve {export,serve,validate} [--help]\n\n"
            "  export    export the models to ONNX with manifest.json and parity figures\n"
            "  serve     serve /normalize, /encode and the V2 protocol (exports first if needed)\n"
            "  validate  run every model against the NumPy reference and print a parity table"
        )
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
