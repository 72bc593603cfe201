"""`normserve validate`: parity of every model against the NumPy reference, in process or against a running server.

A plan is a list of steps (a description and the work), so that the CLI can show progress between them.
Remote: /normalize outputs are compared here with app.reference in float64 on fixed seeded inputs (both
eps modes, gamma/beta, one and two normalized dims); the encoders' weights stay on the server, so
/encode is asked to check itself (`validate: true`) and its figures are reported.
In process, a text encoder also runs the validation texts (the short ones together, then each alone) against the float64
reference: its sentence embedding, hidden states and LayerNorm statistics. No route checks one over HTTP yet.
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.cli import http
from app.core import reference
from app.core.layernorm import FLOAT32_ULP, NORMALIZE_ATOL
from app.core.model import Model, ModelLoadError
from app.core.repository import LegacyLayout
from app.core.textencoder import TextEncoderModel
from app.server.control import LOAD_ERRORS
from app.server.worker import Worker
from app.settings import Settings

SEED = 20261122
TIMEOUT_S = 60.0
# (name, shape, k, eps, eps_mode, gamma/beta, offset): both eps modes, one and two normalized dims, large offsets.
NORMALIZE_CASES = (
    ("var k=1", (4, 16), 1, 1e-5, "var", False, 0.0),
    ("std k=1 gamma/beta", (4, 16), 1, 1e-6, "std", True, 0.0),
    ("var k=2 gamma/beta +100", (3, 5, 16), 2, 1e-5, "var", True, 100.0),
    ("std k=2 +100", (3, 5, 16), 2, 1e-5, "std", False, 100.0),
)


# A text encoder's validation texts: other scripts and lengths than its warm-up's, the last past any maximum length.
VALIDATION_TEXTS = (
    "How many people live in Berlin?",
    "Berlin hat rund 3,8 Millionen Einwohner.",
    "Москва — столица России.",
    "القاهرة هي عاصمة مصر",
    "中文、日本語、한국어 mixed with English and numbers 1234567890.",
    "x",
    " ".join(["every word of this text counts toward the maximum length"] * 80),
)


class ValidateError(RuntimeError):
    """A check that could not run at all: no models, an unreachable server, an unexpected answer."""


@dataclass(frozen=True)
class Check:
    model: str
    check: str
    max_abs_diff: float
    atol: float

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.atol  # NaN fails


Step = tuple[str, Callable[[], list[Check]]]


def in_process_plan(model_dir: Path, atol: float | None = None) -> list[Step]:
    """The steps of Lifecycle.start, one by one: load every version the repository's policies select (sha256,
    sessions), then the parity warm-up of each; a text encoder's also on the validation texts."""
    worker = Worker(Settings(model_dir=model_dir))
    try:  # before any step: a missing repository or the old layout is a plain one-line error
        worker.lifecycle.control.repository.check_layout()
    except (LegacyLayout, OSError) as e:
        raise ValidateError(f"{e} or pass --model-dir") from None
    built: list[Model] = []

    def load() -> list[Check]:
        try:
            built.extend(worker.lifecycle.build_startup())
        except LOAD_ERRORS as e:
            raise ValidateError(str(e)) from None
        return []

    def warm_up() -> list[Check]:
        figures = worker.lifecycle.warm_up(built)  # ModelLoadError past its own tolerance: the CLI reports it
        checks = [
            Check(f"{name}/{version}", "warm-up vs NumPy", diff, own if atol is None else atol)
            for (name, version), (diff, own) in figures.items()
        ]
        return checks + [
            Check(f"{m.name}/{m.version}", f"texts: {what}", diff, own if atol is None else atol)
            for m in built
            if isinstance(m, TextEncoderModel)
            for what, (diff, own) in text_figures(m).items()
        ]

    return [(f"verifying sha256 and loading {model_dir}", load), ("parity warm-up against NumPy", warm_up)]


def text_figures(model: TextEncoderModel) -> dict[str, tuple[float, float]]:
    """The worst (max abs diff, tolerance) of each output over the validation texts, the short ones batched
    together and each alone: an answer must not depend on what it was padded with."""
    return model.check(VALIDATION_TEXTS[:-1], *([text] for text in VALIDATION_TEXTS))


def remote_plan(url: str, atol: float | None = None) -> list[Step]:
    """Every serving version: each /normalize case (a learned LayerNorm: one on its own shape, with gamma and
    beta sent), or /encode with `validate: true`; the server must be ready."""
    base = _base_url(url)
    _call("GET", f"{base}/v2/health/ready")  # before any step: an unreachable or unready server is one line
    rng = np.random.default_rng(SEED)
    steps: list[Step] = []
    for name, version, meta in _serving(base):
        shapes = {t["name"]: t["shape"] for t in meta.get("inputs", [])}
        if "input_ids" in shapes:  # a text encoder: its weights stay on the server, which has no route to check it
            steps.append((f"{name} v{version}: a text encoder, not checked over HTTP (validate in process)", list))
            continue
        if "padding_mask" in shapes:
            steps.append(
                (f"POST /encode ({name} v{version}, validate: true)", _encode_step(base, name, version, rng, atol))
            )
            continue
        trailing = [int(d) for d in shapes.get("input", [-1, -1])[1:]]
        cases = (
            NORMALIZE_CASES
            if trailing == [-1]
            else [("learned", (3, *trailing), len(trailing), 1e-5, "var", True, 0.0)]
        )
        for case in cases:
            doc, expected = _normalize_case(rng, case)
            doc.update(model=name, version=int(version))
            label = f"{name}/{version}"
            steps.append(
                (f"POST /normalize ({label}, {case[0]})", _normalize_step(base, label, case[0], doc, expected, atol))
            )
    return steps


def _serving(base: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, version, metadata) of every version the server serves, from Triton's statistics (no token needed)."""
    stats = _call("GET", f"{base}/v2/models/stats").get("model_stats", [])
    found = sorted({(str(m["name"]), str(m["version"])) for m in stats})
    return [(n, v, _call("GET", f"{base}/v2/models/{n}/versions/{v}")) for n, v in found]


def _base_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValidateError(f"--url {url!r} is not an http(s)://host:port URL")
    return url.rstrip("/")


def _normalize_case(rng: np.random.Generator, case: tuple[Any, ...]) -> tuple[dict[str, Any], tuple[np.ndarray, float]]:
    _, shape, k, eps, mode, affine, offset = case
    x = rng.standard_normal(shape) * 4 + offset
    x32 = x.astype(np.float32)  # the server computes on float32: the reference gets the same values
    doc: dict[str, Any] = {"data": x32.tolist(), "normalized_shape": list(shape[-k:]), "eps": eps, "eps_mode": mode}
    gamma = beta = None
    if affine:
        gamma = (1 + 0.1 * rng.standard_normal(shape[-k:])).astype(np.float32)
        beta = (0.5 * rng.standard_normal(shape[-k:])).astype(np.float32)
        doc.update(gamma=gamma.tolist(), beta=beta.tolist())
    ref = reference.layer_norm(x32, k, eps, mode, gamma, beta).output
    gamma_max = 1.0 if gamma is None else max(1.0, float(np.abs(gamma).max()))
    # The service's own promise (app/core/layernorm.py): 1e-5 x max(1, |gamma|) plus 2**-23 x max|output|.
    atol = NORMALIZE_ATOL * gamma_max + FLOAT32_ULP * float(np.abs(ref).max())
    return doc, (ref, atol)


def _normalize_step(
    base: str, model: str, case: str, doc: dict[str, Any], expected: tuple[np.ndarray, float], atol: float | None
) -> Callable[[], list[Check]]:
    def step() -> list[Check]:
        ref, default_atol = expected
        got = _call("POST", f"{base}/normalize", doc)
        out = np.asarray(got.get("output"), dtype=np.float64)
        if out.shape != ref.shape:
            raise ValidateError(f"POST {base}/normalize: output shape {list(out.shape)}, expected {list(ref.shape)}")
        return [Check(model, case, float(np.abs(out - ref).max()), default_atol if atol is None else atol)]

    return step


def _encode_step(
    base: str, name: str, version: str, rng: np.random.Generator, atol: float | None
) -> Callable[[], list[Check]]:
    seed = int(rng.integers(2**32))  # drawn now: the inputs do not depend on the order steps run in

    def step() -> list[Check]:
        meta = _call("GET", f"{base}/v2/models/{name}/versions/{version}")
        d_model = next(int(t["shape"][-1]) for t in meta.get("inputs", []) if t.get("name") == "input")
        x = np.random.default_rng(seed).standard_normal((2, 7, d_model)).astype(np.float32)
        mask = np.zeros((2, 7), dtype=bool)
        mask[1, 4:] = True  # the second sequence is padded: masking is checked too
        doc = {"data": x.tolist(), "padding_mask": mask.tolist(), "model": name, "version": int(version)}
        doc["validate"] = True
        validation = _call("POST", f"{base}/encode", doc).get("validation") or {}
        if "max_abs_diff" not in validation:
            raise ValidateError(f"POST {base}/encode: the answer has no validation figures")
        return [
            Check(
                f"{name}/{version}",
                "encode, validate: true",
                float(validation["max_abs_diff"]),
                float(validation["atol"]) if atol is None else atol,
            )
        ]

    return step


def _call(method: str, url: str, doc: Any = None) -> dict[str, Any]:
    """One JSON request; ValidateError with the server's own error message on any failure."""
    try:
        answer: dict[str, Any] = http.call(method, url, doc, timeout=TIMEOUT_S)
    except http.RequestFailed as e:
        raise ValidateError(str(e)) from None
    return answer


def _parser() -> argparse.ArgumentParser:
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
        "plus 2**-23 x max|output| for layernorm, NORMSERVE_VALIDATE_ATOL for the encoders)",
    )
    return p


def command(argv: list[str]) -> int:
    """`normserve validate`: run the plan step by step, print the parity table; exit 0, 1 (a check failed) or 2."""
    args = _parser().parse_args(argv)
    from app.cli import console

    checks: list[Check] = []
    try:
        plan = remote_plan(args.url, args.atol) if args.url else in_process_plan(args.model_dir, args.atol)
        with console.Steps("validate", total=len(plan)) as step:
            for description, run in plan:
                step(description)
                checks += run()
    except ValidateError as e:
        print(f"normserve validate: error: {e}", file=sys.stderr)
        return 2
    except ModelLoadError as e:  # the warm-up stops at a model past its own tolerance
        print(f"normserve validate: FAIL: {e}", file=sys.stderr)
        return 1
    failed = sum(not c.passed for c in checks)
    console.stdout.print(console.parity_table(checks, f"parity against NumPy: {args.url or args.model_dir}"))
    console.stdout.print(f"{failed} of {len(checks)} checks failed" if failed else f"all {len(checks)} checks passed")
    return 1 if failed else 0
