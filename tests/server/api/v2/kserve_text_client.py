"""KServe's own clients, InferenceRESTClient (protocol v2) and InferenceGRPCClient, sending a text encoder texts as
BYTES and token ids as INT64, in a process of its own: prints one JSON line of the sentence embeddings they got.

Its own process for the reason tests/server/api/v2/grpc/kserve_client.py gives: importing kserve registers protobuf
names that tritonclient, loaded in the pytest process, has registered already.
Usage: python -m tests.server.api.v2.kserve_text_client BASE_URL GRPC_ADDRESS MODEL REQUEST
REQUEST (JSON): {"texts": [str], "input_ids": [[int]], "attention_mask": [[int]]}. The answer maps
"{rest|grpc}-{text|ids}-{json|binary}" to the embeddings (binary: REST's binary data, gRPC's raw_input_contents;
json: REST's JSON data, gRPC's typed contents); a failed call fails the process with the client's exception.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput

OUTPUT = "sentence_embedding"


def inputs(request: dict[str, Any], what: str, binary: bool) -> list[InferInput]:
    """The texts as one BYTES tensor (UTF-8), or the token ids and their mask as INT64 tensors."""
    if what == "text":
        arrays = {"text": np.array([t.encode() for t in request["texts"]], dtype=object)}
    else:
        arrays = {n: np.array(request[n], dtype=np.int64) for n in ("input_ids", "attention_mask")}
    made = []
    for name, arr in arrays.items():
        made.append(InferInput(name, list(arr.shape), "BYTES" if arr.dtype == object else "INT64"))
        made[-1].set_data_from_numpy(arr, binary_data=binary)
    return made


async def session(base: str, address: str, model: str, request: dict[str, Any]) -> dict[str, Any]:
    rest = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30, retries=0))
    grpc_client = InferenceGRPCClient(address, timeout=30)
    answers: dict[str, Any] = {}
    try:
        for what in ("text", "ids"):
            for binary in (False, True):
                way = f"{what}-{'binary' if binary else 'json'}"
                outputs = [RequestedOutput(OUTPUT)]
                ask = InferRequest(model, inputs(request, what, binary), request_outputs=outputs)
                got = await rest.infer(base, ask, model_name=model)
                answers[f"rest-{way}"] = got.get_output_by_name(OUTPUT).as_numpy().tolist()
                ask = InferRequest(model, inputs(request, what, binary), request_outputs=outputs)
                got = await grpc_client.infer(ask)
                answers[f"grpc-{way}"] = got.get_output_by_name(OUTPUT).as_numpy().tolist()
        return answers
    finally:
        await rest.close()
        await grpc_client.close()


if __name__ == "__main__":
    base, address, model, request = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    print(json.dumps(asyncio.run(session(base, address, model, request))))
