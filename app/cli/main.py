"""The `normserve` command: dispatch to export, serve, validate and bench (each imported only when run)."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import ValidationError


def needs_extra(command: str, extra: str, module: str | None) -> int:
    """A command whose optional dependencies are missing says which extra brings them, in one line: exit status 2."""
    install = f"pip install -e '.[{extra}]'"
    print(f"normserve {command}: needs the {extra} extra ({module} missing): {install}", file=sys.stderr)
    return 2


def export(argv: list[str]) -> int:
    from app.export.options import parse_args

    args = parse_args(argv)  # --help and bad flags answer before torch is needed
    try:
        from app.export.exporter import run

        if args.kind == "text-encoder":
            from app.export import textexport  # noqa: F401 - transformers and sentence-transformers, the extra's too
    except ImportError as e:  # torch and onnx are the `export` extra, absent from the runtime image
        return needs_extra("export", "export", e.name)
    from app.cli.console import Steps

    with Steps("export") as step:
        return run(args, progress=step)


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


def _serve(argv: list[str]) -> int:
    from app.cli import serve

    return serve.command(argv)


def _validate(argv: list[str]) -> int:
    from app.cli import validate

    return validate.command(argv)


def _models(argv: list[str]) -> int:
    from app.cli import models

    return models.command(argv)


COMMANDS = {"export": export, "serve": _serve, "validate": _validate, "models": _models, "bench": _bench}


USAGE = """usage: normserve {export,serve,validate,models,bench} [--help]

  export    export the default models, a trained encoder or layernorm of yours, or a Hugging Face text encoder
            (export text-encoder), into the model repository
  serve     serve /normalize, /encode and the V2 protocol (exports first if needed)
  validate  run every model against the NumPy reference and print a parity table
  models    list, load and unload a running server's models; migrate the old models/ layout
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
