"""MLServer's gRPC converters against a server, run by the python of MLServer's own venv: one JSON line out.

MLServer builds its requests from its pydantic types with `ModelInferRequestConverter.from_types`; a float
parameter is dropped there without a word (its InferParameter has no double), so a string is the only way
such a client sends eps. The venv is the benchmark's (.bench/mlserver-venv, `normserve bench --with-mlserver`
creates it): MLServer never enters the project's venv, and its `inference.*` messages clash with tritonclient's.
Usage: .bench/mlserver-venv/bin/python tests/server/api/v2/grpc/mlserver_client.py ADDRESS PARAMETERS (JSON)
"""

from __future__ import annotations

import json
import sys
from typing import Any

import grpc
from mlserver import types
from mlserver.codecs import NumpyCodec
from mlserver.grpc import converters, dataplane_pb2_grpc

X23 = [0.2, 0.1, 0.3, 0.5, 0.1, 0.1]  # [[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]], row-major


def session(address: str, parameters: dict[str, Any]) -> dict[str, Any]:
    request = types.InferenceRequest(
        id="mlserver",
        parameters=types.Parameters(**parameters),
        inputs=[types.RequestInput(name="input", shape=[2, 3], datatype="FP32", data=X23)],
    )
    message = converters.ModelInferRequestConverter.from_types(request, model_name="layernorm")
    sent = {name: p.WhichOneof("parameter_choice") for name, p in message.parameters.items()}
    with grpc.insecure_channel(address) as channel:
        stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            answer = converters.ModelInferResponseConverter.to_types(stub.ModelInfer(message, timeout=30))
        except grpc.RpcError as e:
            return {"sent": sent, "code": e.code().name, "details": e.details()}
    outputs = {o.name: NumpyCodec.decode_output(o).tolist() for o in answer.outputs}
    return {"sent": sent, "id": answer.id, "outputs": outputs}


if __name__ == "__main__":
    print(json.dumps(session(sys.argv[1], json.loads(sys.argv[2]))))
