"""Export the ONNX models and models/manifest.json: `python scripts/export_onnx.py --help`."""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a file (python scripts/export_onnx.py) the repository root is not on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.export.exporter import main

if __name__ == "__main__":
    sys.exit(main())
