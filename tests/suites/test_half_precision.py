"""Half precision end to end (issue 26): FP16 and BF16 through tritonclient (HTTP binary and JSON, gRPC), KServe's
clients, raw V2 bodies and /normalize and /encode's dtype, on one live server with HTTP and gRPC.

Every LayerNorm output element is within one unit in the last place of its datatype of the float64 truth on the
exact half-precision inputs (tests/halfcases.py: random rows, offsets, tiny, huge, constant; plain and affine).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from app.core import reference
from app.core.halfprecision import HALF_DTYPES, narrow, shortest, ulp_errors, widen
from tests.halfcases import CASES, HalfCase
from tests.live_server import ROOT
from tests.server.api.v2.grpc.live import GrpcServer, grpc_server

Send = Callable[[GrpcServer, str, list[tuple[str, np.ndarray]]], tuple[str, np.ndarray]]
RANGE = {"FP16": "float16's finite range (|x| <= 65504)", "BF16": "bfloat16's finite range (|x| <= 3.389531e+38)"}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    with grpc_server(tmp_path_factory.mktemp("half")) as server:
        yield server


def _tensors(case: HalfCase) -> list[tuple[str, np.ndarray]]:
    named = (("input", case.x), ("gamma", case.gamma), ("beta", case.beta))
    return [(name, arr) for name, arr in named if arr is not None]


def http_binary(live: GrpcServer, model: str, tensors: list[tuple[str, np.ndarray]]) -> tuple[str, np.ndarray]:
    return _http(live, model, tensors, binary=True)


def http_json(live: GrpcServer, model: str, tensors: list[tuple[str, np.ndarray]]) -> tuple[str, np.ndarray]:
    """tritonclient's JSON for FP16; it sends BF16 only as binary, so BF16 numbers go as any other client's JSON."""
    if tensors[0][1].dtype == np.float16:
        return _http(live, model, tensors, binary=False)
    datatype = "BF16"
    inputs = [
        {"name": n, "datatype": datatype, "shape": list(a.shape), "data": widen(a).ravel().tolist()} for n, a in tensors
    ]
    answer = httpx.post(f"{live.base}/v2/models/{model}/infer", json={"inputs": inputs}, timeout=30)
    assert answer.status_code == 200, answer.text
    output = next(o for o in answer.json()["outputs"] if o["name"] == "output")
    # The numbers are the exact BF16 values: rounding them to BF16 changes nothing.
    values = np.array(output["data"], np.float64).reshape(output["shape"])
    return output["datatype"], narrow(values, datatype, "output")


def _http(live: GrpcServer, model: str, tensors: list[tuple[str, np.ndarray]], binary: bool) -> tuple[str, np.ndarray]:
    client = th.InferenceServerClient(live.base.removeprefix("http://"))
    inputs = []
    for name, arr in tensors:
        tensor = th.InferInput(name, list(arr.shape), "FP16" if arr.dtype == np.float16 else "BF16")
        tensor.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(tensor)
    answer = client.infer(model, inputs, outputs=[th.InferRequestedOutput("output", binary_data=binary)])
    client.close()
    return answer.get_response()["outputs"][0]["datatype"], answer.as_numpy("output")


def grpc_raw(live: GrpcServer, model: str, tensors: list[tuple[str, np.ndarray]]) -> tuple[str, np.ndarray]:
    client = tg.InferenceServerClient(live.address)
    inputs = []
    for name, arr in tensors:
        tensor = tg.InferInput(name, list(arr.shape), "FP16" if arr.dtype == np.float16 else "BF16")
        tensor.set_data_from_numpy(arr)
        inputs.append(tensor)
    answer = client.infer(model, inputs, outputs=[tg.InferRequestedOutput("output")])
    client.close()
    return answer.get_output("output").datatype, answer.as_numpy("output")


TRANSPORTS: list[Any] = [
    pytest.param(http_binary, id="tritonclient-http-binary"),
    pytest.param(http_json, id="tritonclient-http-json"),
    pytest.param(grpc_raw, id="tritonclient-grpc"),
]


@pytest.mark.parametrize("send", TRANSPORTS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_layernorm_answers_in_the_inputs_half_type_within_one_ulp(live: GrpcServer, send: Send, case: HalfCase) -> None:
    datatype, output = send(live, "layernorm", _tensors(case))
    assert datatype == case.datatype
    assert output.dtype == HALF_DTYPES[case.datatype]
    assert float(ulp_errors(output, case.truth(), case.datatype).max()) <= 1.0


def test_kserve_clients_send_fp16_and_get_fp16_within_one_ulp(live: GrpcServer) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tests.suites.kserve_half_client", live.base, live.address],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    answers = json.loads(out.stdout)
    fp16 = [c for c in CASES if c.datatype == "FP16"]
    assert sorted(answers) == sorted(c.id for c in fp16)
    for case in fp16:
        for client in ("rest", "grpc"):
            got = answers[case.id][client]
            assert got["datatype"] == "FP16"
            output = np.array(got["bits"], np.uint16).view(np.float16)
            assert float(ulp_errors(output, case.truth(), "FP16").max()) <= 1.0, (case.id, client)


@pytest.mark.parametrize("send", TRANSPORTS)
@pytest.mark.parametrize("datatype", list(HALF_DTYPES))
@pytest.mark.parametrize("model", ["encoder", "encoder-preln"])
def test_the_encoder_rounds_its_float32_answer_once(live: GrpcServer, send: Send, datatype: str, model: str) -> None:
    """Within one unit in the last place of the half type (or 2e-3, whichever is larger) of the FP32 answer on the
    same input, sent as FP32 by the same transport."""
    x = narrow(np.random.default_rng(5).standard_normal((2, 6, 128)), datatype, "x")
    got_type, output = send(live, model, [("input", x)])
    client = th.InferenceServerClient(live.base.removeprefix("http://"))
    tensor = th.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(widen(x))
    fp32 = client.infer(model, [tensor], outputs=[th.InferRequestedOutput("output")]).as_numpy("output")
    client.close()
    assert (got_type, output.dtype) == (datatype, HALF_DTYPES[datatype])
    within = (ulp_errors(output, fp32.astype(np.float64), datatype) <= 1) | (np.abs(widen(output) - fp32) <= 2e-3)
    assert bool(within.all())


# ---- the datatypes of the outputs, asked for (raw V2 JSON, as any client can send it) ---------------------------


@pytest.mark.parametrize(
    ("sent", "asked", "answered"),
    [
        ("FP16", {}, {"output": "FP16", "mean": "FP32", "inv_std_dev": "FP32"}),
        ("BF16", {"mean": "FP64"}, {"output": "BF16", "mean": "FP64", "inv_std_dev": "FP32"}),
        ("BF16", {"mean": "BF16"}, {"output": "BF16", "mean": "BF16", "inv_std_dev": "FP32"}),
        ("FP32", {"output": "FP16"}, {"output": "FP16", "mean": "FP32", "inv_std_dev": "FP32"}),
        ("FP16", {"output": "FP32", "inv_std_dev": "BF16"}, {"output": "FP32", "mean": "FP32", "inv_std_dev": "BF16"}),
        ("FP64", {"output": "BF16"}, {"output": "BF16", "mean": "FP64", "inv_std_dev": "FP64"}),
    ],
)
def test_outputs_come_in_the_inputs_datatype_statistics_of_half_inputs_in_fp32_unless_another_is_asked(
    live: GrpcServer, sent: str, asked: dict[str, str], answered: dict[str, str]
) -> None:
    x = narrow(np.array([[0.1, 0.2, 0.35, 1000.5], [3.0, -1.0, 2.5, 7.0]]), "BF16", "x")  # exact in every type
    outputs = [{"name": n, **({"parameters": {"datatype": asked[n]}} if n in asked else {})} for n in answered]
    body = {"inputs": [{"name": "input", "datatype": sent, "shape": [2, 4], "data": widen(x).ravel().tolist()}]}
    answer = httpx.post(f"{live.base}/v2/models/layernorm/infer", json={**body, "outputs": outputs}, timeout=30)
    assert answer.status_code == 200, answer.text
    got = {o["name"]: o for o in answer.json()["outputs"]}
    assert {n: o["datatype"] for n, o in got.items()} == answered
    ref = reference.layer_norm(widen(x), 1, 1e-5, "var")
    truth = {"output": ref.output, "mean": ref.mean, "inv_std_dev": 1 / np.sqrt(ref.var + 1e-5)}
    for name, datatype in answered.items():
        values = np.array(got[name]["data"], np.float64)
        if datatype in HALF_DTYPES:
            assert np.array_equal(widen(narrow(values, datatype, name)), values)  # exactly a value of the type
            assert float(ulp_errors(narrow(values, datatype, name), truth[name].ravel(), datatype).max()) <= 1.0
        else:
            np.testing.assert_allclose(values, truth[name].ravel(), rtol=1e-6, atol=2e-6)


def _statistics_of_a_constant_row(live: GrpcServer, module: Any, datatype: str) -> dict[str, tuple[str, np.ndarray]]:
    """tritonclient's default request: no outputs named, so every one comes back."""
    x = narrow(np.array([[3.0, 3.0, 3.0, 3.0], [0.1, 0.2, 0.35, 1000.5]]), datatype, "x")
    grpc_client = module is tg
    client = module.InferenceServerClient(live.address if grpc_client else live.base.removeprefix("http://"))
    tensor = module.InferInput("input", list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    answer = client.infer("layernorm", [tensor], parameters={"eps": 1e-12})
    client.close()
    outputs = (answer.get_response(as_json=True) if grpc_client else answer.get_response())["outputs"]
    return {o["name"]: (o["datatype"], answer.as_numpy(o["name"])) for o in outputs}


@pytest.mark.parametrize("module", [th, tg], ids=["tritonclient-http", "tritonclient-grpc"])
@pytest.mark.parametrize("datatype", list(HALF_DTYPES))
def test_statistics_of_a_half_precision_input_come_in_fp32_where_inv_std_dev_does_not_fit_fp16(
    live: GrpcServer, module: Any, datatype: str
) -> None:
    """A constant row at eps=1e-12 has inv_std_dev 1e6, beyond FP16's 65504: as onnxruntime's LayerNormalization
    types Mean and InvStdDev, the statistics are FP32 whatever the half type; `output` stays in it."""
    got = _statistics_of_a_constant_row(live, module, datatype)
    assert {n: (t, a.dtype) for n, (t, a) in got.items()} == {
        "output": (datatype, HALF_DTYPES[datatype]),
        "mean": ("FP32", np.float32),
        "inv_std_dev": ("FP32", np.float32),
    }
    x = widen(narrow(np.array([[3.0, 3.0, 3.0, 3.0], [0.1, 0.2, 0.35, 1000.5]]), datatype, "x"))
    ref = reference.layer_norm(x, 1, 1e-12, "var")
    assert float(ulp_errors(got["output"][1], ref.output, datatype).max()) <= 1.0
    np.testing.assert_allclose(got["mean"][1], ref.mean, rtol=1e-6)
    np.testing.assert_allclose(got["inv_std_dev"][1], 1 / np.sqrt(ref.var + 1e-12), rtol=1e-6)


# ---- /normalize and /encode: "dtype" ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_normalize_rounds_data_gamma_and_beta_to_dtype_and_answers_in_it(live: GrpcServer, dtype: str) -> None:
    datatype = {"float16": "FP16", "bfloat16": "BF16"}[dtype]
    rng = np.random.default_rng(8)
    data, gamma, beta = rng.standard_normal((4, 32)) * 3 + 600, 1 + rng.standard_normal(32) / 2, rng.standard_normal(32)
    body = {"data": data.tolist(), "gamma": gamma.tolist(), "beta": beta.tolist(), "dtype": dtype}
    answer = httpx.post(f"{live.base}/normalize", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    x, g, b = (widen(narrow(v, datatype, "x")) for v in (data, gamma, beta))
    ref = reference.layer_norm(x, 1, 1e-5, "var", g, b)
    output = np.array(doc["output"], np.float64)
    half = narrow(output, datatype, "output")
    assert float(ulp_errors(half, ref.output, datatype).max()) <= 1.0
    # Printed as the shortest decimal of each value: the decimals of `shortest`, which read back as the value.
    np.testing.assert_array_equal(output, shortest(half, datatype))
    np.testing.assert_array_equal(doc["stats"]["mean"], ref.mean)  # float64 statistics of the rounded data
    np.testing.assert_array_equal(doc["stats"]["var"], ref.var)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_encode_answers_in_dtype_within_one_ulp_of_its_float32_answer(live: GrpcServer, dtype: str) -> None:
    datatype = {"float16": "FP16", "bfloat16": "BF16"}[dtype]
    data = np.random.default_rng(9).standard_normal((5, 128))
    half = httpx.post(f"{live.base}/encode", json={"data": data.tolist(), "dtype": dtype}, timeout=30).json()
    exact = widen(narrow(data, datatype, "data"))
    fp32 = httpx.post(f"{live.base}/encode", json={"data": exact.tolist()}, timeout=30).json()
    output = narrow(np.array(half["output"], np.float64), datatype, "output")
    assert float(ulp_errors(output, np.array(fp32["output"], np.float64), datatype).max()) <= 1.0
    assert half["layer_norms"] == fp32["layer_norms"]  # statistics of the same (rounded) input, as FP32 sends them


# ---- errors: the same clear 4xx as FP32, naming the field -------------------------------------------------------


def _binary(datatype: str, shape: list[int], raw: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(
        {
            "inputs": [
                {"name": "input", "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": len(raw)}}
            ]
        }
    ).encode()
    return head + raw, {"Inference-Header-Content-Length": str(len(head))}


def _half_bytes(datatype: str, values: list[float]) -> bytes:
    return np.array(values, np.float32).astype(HALF_DTYPES[datatype]).tobytes()


HTTP_ERRORS = [
    pytest.param(
        "/v2/models/layernorm/infer",
        _binary("FP16", [1, 4], _half_bytes("FP16", [1, float("nan"), 2, 3])),
        400,
        f"inputs.input: element [0, 1] = nan is outside {RANGE['FP16']}",
        id="v2-binary-fp16-nan",
    ),
    pytest.param(
        "/v2/models/layernorm/infer",
        _binary("BF16", [2, 2], _half_bytes("BF16", [1, 2, 3, float("-inf")])),
        400,
        f"inputs.input: element [1, 1] = -inf is outside {RANGE['BF16']}",
        id="v2-binary-bf16-inf",
    ),
    pytest.param(
        "/v2/models/layernorm/infer",
        _binary("FP16", [1, 4], b"\x00" * 7),
        400,
        "inputs.input.parameters.binary_data_size: binary_data_size is 7 bytes, but shape [1, 4] of FP16 needs 8",
        id="v2-binary-odd-byte-count",
    ),
    pytest.param(
        "/v2/models/layernorm/infer",
        ({"inputs": [{"name": "input", "datatype": "FP16", "shape": [1, 4], "data": [1, 2, 3, 70000]}]}, {}),
        400,
        f"inputs.input: element [0, 3] = 70000 is outside {RANGE['FP16']}",
        id="v2-json-fp16-beyond-range",
    ),
    pytest.param(
        "/v2/models/layernorm/infer",
        ({"inputs": [{"name": "input", "datatype": "BF16", "shape": [2], "data": [1e39, 1]}]}, {}),
        400,
        f"inputs.input: element [0] = 1e+39 is outside {RANGE['BF16']}",
        id="v2-json-bf16-beyond-range",
    ),
    pytest.param(
        "/v2/models/layernorm/infer",
        (
            {
                "inputs": [{"name": "input", "datatype": "FP16", "shape": [2], "data": [1, 2]}],
                "outputs": [{"name": "mean", "parameters": {"datatype": "INT8"}}],
            },
            {},
        ),
        400,
        "outputs.mean.parameters.datatype: datatype 'INT8' is not supported; expected FP32, FP64, FP16 or BF16",
        id="v2-unknown-output-datatype",
    ),
    pytest.param(
        "/v2/models/layernorm/infer",
        (
            {
                "inputs": [
                    {"name": "input", "datatype": "FP16", "shape": [2], "data": [-1, 1]},
                    {"name": "gamma", "datatype": "FP16", "shape": [2], "data": [65504, 65504]},
                    {"name": "beta", "datatype": "FP16", "shape": [2], "data": [65504, 65504]},
                ],
                "parameters": {"eps_mode": "std", "eps": 1e-30},
            },
            {},
        ),
        400,
        f"output: element [1] = 131008 is outside {RANGE['FP16']}",
        id="v2-output-beyond-range",
    ),
    pytest.param(
        "/normalize",
        ({"data": [[1.0, 70000.0]], "dtype": "float16"}, {}),
        422,
        f"data: element [0, 1] = 70000 is outside {RANGE['FP16']}",
        id="normalize-data-beyond-range",
    ),
    pytest.param(
        "/normalize",
        ({"data": [[1.0, 2.0]], "gamma": [1.0, 1e39], "dtype": "bfloat16"}, {}),
        422,
        f"gamma: element [1] = 1e+39 is outside {RANGE['BF16']}",
        id="normalize-gamma-beyond-range",
    ),
    pytest.param(
        "/encode",
        ({"data": [[1.0] * 127 + [1e5]], "dtype": "float16"}, {}),
        422,
        f"data: element [0, 127] = 100000 is outside {RANGE['FP16']}",
        id="encode-data-beyond-range",
    ),
    pytest.param(
        "/encode",
        ({"data": [[1.0] * 128], "dtype": "float8"}, {}),
        422,
        "dtype: Input should be 'float32', 'float16' or 'bfloat16' (got 'float8')",
        id="encode-unknown-dtype",
    ),
]


@pytest.mark.parametrize(("path", "request_", "status", "message"), HTTP_ERRORS)
def test_bad_half_precision_input_is_a_clear_4xx_naming_the_field(
    live: GrpcServer, path: str, request_: tuple[Any, dict[str, str]], status: int, message: str
) -> None:
    body, headers = request_
    if isinstance(body, bytes):
        answer = httpx.post(f"{live.base}{path}", content=body, headers=headers, timeout=30)
    else:
        answer = httpx.post(f"{live.base}{path}", json=body, timeout=30)
    assert (answer.status_code, answer.json()) == (status, {"error": message})


def _grpc_request(datatype: str, shape: list[int], raw: bytes | None = None, fp32: list[float] | None = None) -> Any:
    r = pb.ModelInferRequest(model_name="layernorm")
    tensor = r.inputs.add(name="input", datatype=datatype, shape=shape)
    if raw is not None:
        r.raw_input_contents.append(raw)
    else:
        tensor.contents.fp32_contents.extend(fp32 or [])
    return r


GRPC_ERRORS = [
    pytest.param(
        _grpc_request("FP16", [1, 4], _half_bytes("FP16", [1, float("inf"), 2, 3])),
        f"inputs.input: element [0, 1] = inf is outside {RANGE['FP16']}",
        id="raw-fp16-inf",
    ),
    pytest.param(
        _grpc_request("BF16", [1, 4], _half_bytes("BF16", [float("nan"), 1, 2, 3])),
        f"inputs.input: element [0, 0] = nan is outside {RANGE['BF16']}",
        id="raw-bf16-nan",
    ),
    pytest.param(
        _grpc_request("BF16", [1, 4], b"\x00" * 9),
        "inputs.input: raw_input_contents is 9 bytes, but shape [1, 4] of BF16 needs 8",
        id="raw-odd-byte-count",
    ),
    pytest.param(
        _grpc_request("FP16", [1, 4], fp32=[1, 2, 3, 70000]),
        f"inputs.input: element [0, 3] = 70000 is outside {RANGE['FP16']}",
        id="fp32-contents-beyond-fp16",
    ),
]


@pytest.mark.parametrize(("request_", "message"), GRPC_ERRORS)
def test_bad_half_precision_input_over_grpc_is_invalid_argument_naming_the_field(
    live: GrpcServer, request_: Any, message: str
) -> None:
    with grpc.insecure_channel(live.address) as channel, pytest.raises(grpc.RpcError) as e:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request_, timeout=30)
    assert (e.value.code(), e.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)  # type: ignore[attr-defined]


def test_fp32_contents_for_fp16_are_rounded_as_json_numbers_are(live: GrpcServer) -> None:
    values = [0.1, 0.2, 0.35, 1000.3]
    with grpc.insecure_channel(live.address) as channel:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            _grpc_request("FP16", [1, 4], fp32=values), timeout=30
        )
    output = next(i for i, o in enumerate(answer.outputs) if o.name == "output")
    assert answer.outputs[output].datatype == "FP16"
    got = np.frombuffer(answer.raw_output_contents[output], np.float16)
    x = widen(narrow(np.array(values, np.float32), "FP16", "x"))
    assert float(ulp_errors(got, reference.layer_norm(x[None], 1, 1e-5, "var").output[0], "FP16").max()) <= 1.0


def test_tritonclient_reads_json_bf16_outputs_exactly_as_docs_api_md_says(live: GrpcServer) -> None:
    """docs/api.md section 10 names the type tritonclient's HTTP client reads JSON BF16 numbers into: the
    ml_dtypes.bfloat16 it sends BF16 in (tritonclient 2.73), which holds every value exactly."""
    import ml_dtypes

    x = np.array([[1000.0, 1004.0, 1008.0, 1020.0]], dtype=ml_dtypes.bfloat16)
    inp = th.InferInput("input", list(x.shape), "BF16")
    inp.set_data_from_numpy(x)
    client = th.InferenceServerClient(live.base.removeprefix("http://"))
    outputs = [th.InferRequestedOutput("output", binary_data=False)]
    got = client.infer("layernorm", [inp], outputs=outputs).as_numpy("output")
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.astype(np.float64), [[-1.0703125, -0.53515625, 0.0, 1.6015625]])
    api = (ROOT / "docs" / "api.md").read_text()
    assert "(tritonclient reads BF16 numbers into `ml_dtypes.bfloat16`, exactly)" in api
