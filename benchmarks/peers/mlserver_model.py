"""COMPARISON CODE, not part of normserve: models/layernorm/1/model.onnx behind MLServer (SeldonIO) 1.7.1.

Runs in its own venv (the benchmark creates it under .bench/ with `pip install mlserver==1.7.1
onnxruntime numpy`), never imported by normserve. A custom `MLModel` runs onnxruntime on the same
ONNX file and answers `output` plus the per-row statistics normserve's /normalize answers (mean, var,
std), on MLServer's V2 REST endpoint and its gRPC servicer. MLServer's settings are its defaults but
two: `parallel_workers=0` (its default of 1 starts a worker pool that does not come up with the uvloop
pip installs today, MLServer issue #2286; 0 is also its faster setting, no hand-off to a worker
process) and `host=127.0.0.1`, which MLServer uses for its HTTP, gRPC and metrics servers alike.
Started as `python mlserver_model.py --model_path PATH --http_port N --grpc_port M --metrics_port K`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import numpy as np
import onnxruntime as ort
from mlserver import MLModel, MLServer
from mlserver.codecs import NumpyCodec
from mlserver.settings import ModelParameters, ModelSettings, Settings
from mlserver.types import InferenceRequest, InferenceResponse

EPS = 1e-5


class LayerNormModel(MLModel):  # type: ignore[misc]
    async def load(self) -> bool:
        path = self.settings.parameters.uri
        self.session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        rows = x.reshape(-1, x.shape[-1])
        R, D = rows.shape
        feeds = {
            "input": rows,
            "gamma": np.ones(D, np.float32),
            "beta": np.zeros(D, np.float32),
            "eps_var": np.full((R, 1), EPS, np.float32),
            "eps_std": np.zeros((R, 1), np.float32),
        }
        out, mean, inv_std = self.session.run(None, feeds)  # the graph's output, mean, inv_std_dev
        std = 1.0 / inv_std.reshape(x.shape[:-1])  # sqrt(var + eps), as /normalize's `std` in mode var
        outputs = [
            NumpyCodec.encode_output("output", out.reshape(x.shape)),
            NumpyCodec.encode_output("mean", mean.reshape(x.shape[:-1])),
            NumpyCodec.encode_output("var", std * std - EPS),
            NumpyCodec.encode_output("std", std),
        ]
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model_path", required=True)
    p.add_argument("--http_port", type=int, required=True)
    p.add_argument("--grpc_port", type=int, required=True)
    p.add_argument("--metrics_port", type=int, required=True)
    args = p.parse_args()
    settings = Settings(
        host="127.0.0.1",
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        parallel_workers=0,
    )
    model = ModelSettings(
        name="layernorm", implementation=LayerNormModel, parameters=ModelParameters(uri=args.model_path)
    )
    asyncio.run(MLServer(settings).start([model]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
