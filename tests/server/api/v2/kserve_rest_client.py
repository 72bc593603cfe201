"""KServe's InferenceRESTClient (protocol v2) against a server, in a process of its own: one JSON line of results.

Its own process for the reason tests/server/api/v2/grpc/kserve_client.py gives: importing kserve registers
protobuf names that tritonclient, loaded in the pytest process, has registered already.
Usage: python -m tests.server.api.v2.kserve_rest_client BASE_URL
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

X23 = np.array([[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]], np.float32)


async def session(base: str) -> dict[str, Any]:
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30, retries=0))
    try:
        answers = {}
        for binary in (False, True):
            x = InferInput("input", list(X23.shape), "FP32")
            x.set_data_from_numpy(X23, binary_data=binary)
            request = InferRequest("layernorm", [x], request_id=f"kserve-{binary}", parameters={"eps_mode": "std"})
            answer = await client.infer(base, request, model_name="layernorm")
            answers["binary" if binary else "json"] = {
                "id": answer.id,
                "model_name": answer.model_name,
                "outputs": {o.name: o.as_numpy().tolist() for o in answer.outputs},
            }
        return {
            "live": await client.is_server_live(base),
            "ready": await client.is_server_ready(base),
            "model_ready": await client.is_model_ready(base, "layernorm"),
            "unknown_model_ready": await client.is_model_ready(base, "nope"),
            **answers,
        }
    finally:
        await client.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(session(sys.argv[1]))))
