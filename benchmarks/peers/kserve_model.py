"""COMPARISON CODE, not part of normserve: layernorm.onnx behind the KServe Python model server.

Runs in its own venv (the benchmark creates it under .bench/ with `pip install kserve
onnxruntime numpy`), never imported by normserve. A custom `kserve.Model` on KServe's V2
REST endpoint (`/v2/models/layernorm/infer`), JSON and binary tensors both, one worker, bound to
127.0.0.1 (KServe hard-codes 0.0.0.0, so the config is overridden). With --grpc_port, also KServe's
own gRPC servicer on 127.0.0.1 (KServe's GRPCServer binds [::] and cannot be told otherwise, so its
few lines of set-up are repeated here with a loopback address), in the same process and event loop.
Started as `python kserve_model.py --model_path PATH --http_port N [--grpc_port M]`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import numpy as np
import onnxruntime as ort
from grpc import aio
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
from kserve.protocol.grpc.servicer import InferenceServicer
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


async def serve_grpc(server: ModelServer, port: int) -> None:
    """KServe's GRPCServer.start with a loopback address: its servicer on the model server's data plane."""
    grpc_server = aio.server(
        options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", 64 << 20)]
    )
    servicer = InferenceServicer(server.dataplane, server.model_repository_extension)
    grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, grpc_server)
    grpc_server.add_insecure_port(f"127.0.0.1:{port}")
    await grpc_server.start()
    await grpc_server.wait_for_termination()


async def serve(rest: RESTServer, server: ModelServer, grpc_port: int) -> None:
    await asyncio.gather(rest.start(), *([serve_grpc(server, grpc_port)] if grpc_port else []))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model_path", required=True)
    p.add_argument("--http_port", type=int, required=True)
    p.add_argument("--grpc_port", type=int, default=0)
    args, _ = p.parse_known_args()
    model = LayerNormModel("layernorm", args.model_path)
    model.load()
    server = ModelServer(http_port=args.http_port, enable_grpc=False, workers=1, enable_latency_logging=False)
    server.register_model(model)
    rest = RESTServer(
        "kserve.model_server:app", server.dataplane, server.model_repository_extension, args.http_port, workers=1
    )
    rest.config.host = "127.0.0.1"  # loopback only: KServe itself binds 0.0.0.0
    asyncio.run(serve(rest, server, args.grpc_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
