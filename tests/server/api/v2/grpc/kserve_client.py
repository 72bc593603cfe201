"""KServe's InferenceGRPCClient against a server, in a process of its own: prints what it got as one JSON line.

Its own process, because KServe's generated messages and tritonclient's both register the `inference.*` protobuf
names in the default descriptor pool, and the second to load fails: a pytest process has tritonclient's.
Usage: python -m tests.server.api.v2.grpc.kserve_client ADDRESS BINARY(0|1) [PARAMETERS (JSON)]
(default parameters {"eps_mode": "std"}); an error status prints {"code": ..., "details": ...}.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import grpc
import numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest

X23 = np.array([[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]], np.float32)


async def session(address: str, binary: bool, parameters: dict[str, Any]) -> dict[str, Any]:
    client = InferenceGRPCClient(address, timeout=30)
    try:
        x = InferInput("input", list(X23.shape), "FP32")
        x.set_data_from_numpy(X23, binary_data=binary)
        request = InferRequest("layernorm", [x], request_id="kserve", parameters=parameters)
        try:
            answer = await client.infer(request)
        except grpc.aio.AioRpcError as e:
            return {"code": e.code().name, "details": e.details()}
        return {
            "live": await client.is_server_live(),
            "ready": await client.is_server_ready(),
            "model_ready": await client.is_model_ready("layernorm"),
            "unknown_model_ready": await client.is_model_ready("nope"),
            "id": answer.id,
            "outputs": {o.name: o.as_numpy().tolist() for o in answer.outputs},
        }
    finally:
        await client.close()


if __name__ == "__main__":
    params = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {"eps_mode": "std"}
    print(json.dumps(asyncio.run(session(sys.argv[1], sys.argv[2] == "1", params))))
