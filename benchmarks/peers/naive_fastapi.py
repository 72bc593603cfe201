"""COMPARISON CODE, not part of normserve: the naive way to serve layernorm.onnx with FastAPI.

A pydantic `list[list[list[float]]]` request (every float validated one by one), the
plain onnxruntime session call, and Python lists out. One uvicorn worker; the benchmark
starts it as `python -m benchmarks.peers.naive_fastapi --model PATH --port N`.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import onnxruntime as ort
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel


class NormalizeRequest(BaseModel):
    data: list[list[list[float]]]
    eps: float = 1e-5


def create_app(model_path: str) -> FastAPI:
    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    app = FastAPI(title="naive layernorm (comparison peer)")

    @app.get("/health")
    def health() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/normalize")
    def normalize(req: NormalizeRequest) -> dict[str, object]:
        x = np.asarray(req.data, dtype=np.float32)
        rows = x.reshape(-1, x.shape[-1])
        R, D = rows.shape
        feeds = {
            "input": rows,
            "gamma": np.ones(D, np.float32),
            "beta": np.zeros(D, np.float32),
            "eps_var": np.full((R, 1), req.eps, np.float32),
            "eps_std": np.zeros((R, 1), np.float32),
        }
        (out,) = session.run(["output"], feeds)
        return {"output": out.reshape(x.shape).tolist(), "shape": list(x.shape)}

    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    uvicorn.run(create_app(args.model), host="127.0.0.1", port=args.port, workers=1, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
