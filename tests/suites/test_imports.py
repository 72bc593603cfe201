"""The serving path never imports torch (the runtime image has none); the layers import only downwards."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live_server import ROOT


def test_importing_the_app_does_not_import_torch_or_onnx() -> None:
    code = "import sys, app.main; print(sorted(m for m in ('torch', 'onnx', 'onnxscript') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# (modules, a package none of them may import): a protocol's transports stand side by side, each on the
# protocol's own rules (app/server/api/v2: rules, config, schemas); the pipeline knows no protocol and no HTTP;
# gRPC takes nothing from HTTP's plumbing (app/server/http); the data plane and the repository's lifecycle are two
# objects, neither reaching into the other; telemetry serves every protocol; the core is no server.
SEPARATE = [
    ("app/server/api/v2/grpc", "app.server.api.v2.http"),
    ("app/server/api/v2/http", "app.server.api.v2.grpc"),
    ("app/server/api/v2", "app.server.api.rest"),
    ("app/server/api/rest", "app.server.api.v2"),
    ("app/server/api/openapi.py", "app.server.api.rest"),
    ("app/server/api/openapi.py", "app.server.api.v2.http"),
    ("app/server/worker.py", "app.server.api"),
    ("app/server/pipeline.py", "app.server.api"),
    ("app/server/worker.py", "app.server.http"),
    ("app/server/pipeline.py", "app.server.http"),
    ("app/server/dataplane.py", "app.server.api"),
    ("app/server/dataplane.py", "app.server.http"),
    ("app/server/dataplane.py", "app.server.worker"),
    ("app/server/dataplane.py", "app.server.lifecycle"),
    ("app/server/lifecycle.py", "app.server.dataplane"),
    ("app/server/lifecycle.py", "app.server.worker"),
    ("app/server/lifecycle.py", "app.server.api"),
    ("app/server/lifecycle.py", "app.server.http"),
    ("app/server/api/rest", "app.server.worker"),
    ("app/server/api/v2/grpc", "app.server.http"),
    ("app/server/telemetry", "app.server.api"),
    ("app/server/telemetry", "app.server.http"),
    ("app/core", "app.server"),
]


def imported(path: Path) -> set[str]:
    """Every module a file names in its imports (`from a import b` names a and a.b)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize(("where", "forbidden"), SEPARATE, ids=[f"{w}-{f}" for w, f in SEPARATE])
def test_a_transport_never_imports_a_sibling_transport_nor_the_pipeline_a_protocol(where: str, forbidden: str) -> None:
    root = ROOT / where
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
    assert files
    offending = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        for name in imported(path)
        if name == forbidden or name.startswith(forbidden + ".")
    }
    assert sorted(offending) == []
