"""COMPARISON CODE, not part of normserve: the peers the benchmark serves the same ONNX file with."""
