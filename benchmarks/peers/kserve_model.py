"""COMPARISON CODE, not part of normserve: layernorm.onnx behind the KServe Python model server.

Runs in its own venv (the benchmark creates it under .bench/ with `pip install kserve
onnxruntime numpy`), never imported by normserve. A custom `kserve.Model` on KServe's V2
REST endpoint (`/v2/models/layernorm/infer`), JSON and binary tensors both, one worker,
no gRPC, bound to 127.0.0.1 (KServe hard-codes 0.0.0.0, so the config is overridden).
Started as `python kserve_model.py --model_path PATH --http_port N`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from kserve.protocol.rest.server import RESTServer


class LayerNormModel(Model):  # type: ignore[misc]
    def __init__(self, name: str, model_path: str) -> None:
        super().__init__(name)
        self.model_path = model_path
        self.session: ort.InferenceSession | None = None

    def load(self) -> bool:
        self.session = ort.InferenceSession(self.model_path, providers=["CPUExecutionProvider"])
        self.ready = True
        return True

    def predict(self, payload: InferRequest, headers: dict[str, str] | None = None) -> InferResponse:
        assert self.session is not None
        x = payload.inputs[0].as_numpy().astype(np.float32, copy=False)
        rows = x.reshape(-1, x.shape[-1])
        R, D = rows.shape
        feeds = {
            "input": rows,
            "gamma": np.ones(D, np.float32),
            "beta": np.zeros(D, np.float32),
            "eps_var": np.full((R, 1), 1e-5, np.float32),
            "eps_std": np.zeros((R, 1), np.float32),
        }
        (out,) = self.session.run(["output"], feeds)
        # binary_data_output for every output, or per requested output (as tritonclient asks).
        requested = payload.request_outputs or []
        binary = payload.use_binary_outputs or any(o.binary_data for o in requested)
        output = InferOutput(name="output", shape=list(x.shape), datatype="FP32")
        output.set_data_from_numpy(out.reshape(x.shape), binary_data=binary)
        return InferResponse(
            response_id=payload.id or "",
            model_name=self.name,
            infer_outputs=[output],
            use_binary_outputs=binary,
            requested_outputs=requested or None,
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model_path", required=True)
    p.add_argument("--http_port", type=int, required=True)
    args, _ = p.parse_known_args()
    model = LayerNormModel("layernorm", args.model_path)
    model.load()
    server = ModelServer(http_port=args.http_port, enable_grpc=False, workers=1, enable_latency_logging=False)
    server.register_model(model)
    rest = RESTServer(
        "kserve.model_server:app", server.dataplane, server.model_repository_extension, args.http_port, workers=1
    )
    rest.config.host = "127.0.0.1"  # loopback only: KServe itself binds 0.0.0.0
    asyncio.run(rest.start())
    return 0


if __name__ == "__main__":
    sys.exit(main())
