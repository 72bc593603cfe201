"""COMPARISON CODE, not part of normserve: the gRPC floor, the least a Python grpcio server does for a ModelInfer.

A grpc.aio server with one generic handler on ModelInfer: parse the request (the tensor's one copy in),
torch.nn.functional.layer_norm on it (one intra-op thread, as normserve's default session), serialize
the answer with the output's raw bytes (the copy out). No V2 checks, no statistics, no framework: the
figure normserve's gRPC rows are a multiple of. Started as `python -m benchmarks.peers.grpc_floor --port N`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import grpc
import torch
from tritonclient.grpc import service_pb2 as pb

OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def model_infer(request: bytes, context: object) -> bytes:
    req = pb.ModelInferRequest.FromString(request)
    shape = list(req.inputs[0].shape)
    x = torch.frombuffer(bytearray(req.raw_input_contents[0]), dtype=torch.float32).reshape(shape)
    out = torch.nn.functional.layer_norm(x, (shape[-1],), eps=1e-5)
    answer = pb.ModelInferResponse(model_name=req.model_name, id=req.id)
    answer.outputs.add(name="output", datatype="FP32", shape=shape)
    answer.raw_output_contents.append(out.numpy().tobytes())
    return bytes(answer.SerializeToString())


async def serve(port: int) -> None:
    server = grpc.aio.server(options=OPTIONS)
    handler = grpc.unary_unary_rpc_method_handler(model_infer)  # bytes in, bytes out: no (de)serializer
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    torch.set_num_threads(1)
    asyncio.run(serve(p.parse_args().port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
