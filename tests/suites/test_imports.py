"""The serving path never imports torch: the runtime image has none."""

from __future__ import annotations

import subprocess
import sys

from tests.live_server import ROOT


def test_importing_the_app_does_not_import_torch_or_onnx() -> None:
    code = "import sys, app.main; print(sorted(m for m in ('torch', 'onnx', 'onnxscript') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
