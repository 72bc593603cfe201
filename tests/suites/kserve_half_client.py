"""KServe's clients (InferenceRESTClient, binary; InferenceGRPCClient, raw) send the FP16 cases of tests/halfcases.py.

Its own process, as tests/server/api/grpc/kserve_client.py explains (kserve's and tritonclient's protobufs clash).
KServe sends FP16 only as binary, and has no BF16 (its NumPy codec has no such type).
Usage: python -m tests.suites.kserve_half_client BASE_URL GRPC_ADDRESS; prints, per case and client, the output's
datatype and its bits (uint16) as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

from tests.halfcases import CASES


def _request(case: Any, binary: bool) -> InferRequest:
    inputs = []
    for name, arr in (("input", case.x), ("gamma", case.gamma), ("beta", case.beta)):
        if arr is not None:
            tensor = InferInput(name, list(arr.shape), "FP16")
            tensor.set_data_from_numpy(arr, binary_data=binary)
            inputs.append(tensor)
    return InferRequest("layernorm", inputs, request_id=case.id)


def _answer(answer: Any) -> dict[str, Any]:
    output = next(o for o in answer.outputs if o.name == "output")
    bits = np.asarray(output.as_numpy(), np.float16).view(np.uint16)
    return {"datatype": output.datatype, "bits": bits.tolist()}


async def session(base: str, address: str) -> dict[str, Any]:
    rest = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30, retries=0))
    grpc = InferenceGRPCClient(address, timeout=30)
    answers: dict[str, Any] = {}
    try:
        for case in (c for c in CASES if c.datatype == "FP16"):
            answers[case.id] = {
                "rest": _answer(await rest.infer(base, _request(case, True), model_name="layernorm")),
                "grpc": _answer(await grpc.infer(_request(case, True))),
            }
    finally:
        await rest.close()
        await grpc.close()
    return answers


if __name__ == "__main__":
    print(json.dumps(asyncio.run(session(sys.argv[1], sys.argv[2]))))
