"""perf_analyzer's data, as its commands in docs/api.md send it, against a live server over HTTP and gRPC.

perf_analyzer itself cannot run here (its 2.60 wheels need glibc 2.38; Debian 12 has 2.36), so each documented
command is read from the docs and its requests are built as perf_analyzer builds them: `--input-data zero`
is zeros of every `--shape` (BOOL false), a data file is one request per entry, all sent as binary tensors
(tritonclient's default, which perf_analyzer shares). Its default `random` data is random bytes: BOOL bytes
are read as C reads them, and FP32 bytes that are NaN are refused, as docs/api.md says.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from app.core import reference
from tests.live_server import ROOT
from tests.server.api.v2.grpc.live import GrpcServer

DOC = ROOT / "docs/api.md"
DTYPES = {"FP32": np.float32, "FP64": np.float64, "BOOL": np.bool_}
COMMANDS = [line for line in DOC.read_text().splitlines() if line.startswith("perf_analyzer ")]


def options(command: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="perf_analyzer", add_help=False)
    parser.add_argument("-m", dest="model", required=True)
    parser.add_argument("-u", dest="url", required=True)
    parser.add_argument("-i", dest="protocol", default="http", choices=["http", "grpc"])
    parser.add_argument("--shape", action="append", default=[])
    parser.add_argument("--input-data", dest="data", default="random")
    return parser.parse_args(shlex.split(command)[1:])


def client(live: GrpcServer, protocol: str) -> Any:
    if protocol == "grpc":
        return tg.InferenceServerClient(live.address)
    return th.InferenceServerClient(live.base.removeprefix("http://"))


def infer(
    live: GrpcServer, protocol: str, model: str, tensors: dict[str, np.ndarray], datatypes: dict[str, str]
) -> Any:
    module: Any = tg if protocol == "grpc" else th
    inputs = []
    for name, arr in tensors.items():
        t = module.InferInput(name, list(arr.shape), datatypes[name])
        t.set_data_from_numpy(arr) if protocol == "grpc" else t.set_data_from_numpy(arr, binary_data=True)
        inputs.append(t)
    return client(live, protocol).infer(model, inputs)


def requests(opts: argparse.Namespace, datatypes: dict[str, str]) -> list[dict[str, np.ndarray]]:
    """What perf_analyzer sends for these options: zeros of every --shape, or each entry of the data file."""
    if opts.data == "zero":
        shapes = {s.split(":")[0]: [int(d) for d in s.split(":")[1].split(",")] for s in opts.shape}
        assert set(shapes) == set(datatypes), "--shape must name every input (max_batch_size is 0)"
        return [{n: np.zeros(shape, DTYPES[datatypes[n]]) for n, shape in shapes.items()}]
    entries = json.loads((ROOT / opts.data).read_text())["data"]
    return [
        {n: np.array(t["content"], DTYPES[datatypes[n]]).reshape(t["shape"]) for n, t in e.items()} for e in entries
    ]


@pytest.mark.parametrize(
    "command", COMMANDS, ids=[f"docs/api.md:{c.split(' -u')[0]}-{i}" for i, c in enumerate(COMMANDS)]
)
def test_each_documented_command_sends_data_the_server_answers(live_grpc: GrpcServer, command: str) -> None:
    opts = options(command)
    assert re.fullmatch(r"127\.0\.0\.1:800[01]", opts.url) and opts.url.endswith(
        "1" if opts.protocol == "grpc" else "0"
    )
    meta = client(live_grpc, "http").get_model_metadata(opts.model)
    datatypes = {t["name"]: t["datatype"] for t in meta["inputs"]}
    sent = requests(opts, datatypes)
    assert sent
    for tensors in sent:
        result = infer(live_grpc, opts.protocol, opts.model, tensors, datatypes)
        output = result.as_numpy("output")
        assert output.shape == tensors["input"].shape and np.isfinite(output).all()
        if opts.model == "layernorm":
            want = reference.layer_norm(tensors["input"], 1, 1e-5, "var", tensors["gamma"], tensors["beta"]).output
            np.testing.assert_allclose(output, want, atol=2e-5 * max(1.0, float(np.abs(tensors["gamma"]).max())))


def test_the_documented_commands_are_found() -> None:
    assert len(COMMANDS) == 4 and sum("--input-data zero" in c for c in COMMANDS) == 3
    assert Path(ROOT / options(COMMANDS[-1]).data).is_file()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_random_bool_bytes_are_true_when_nonzero(live_grpc: GrpcServer, protocol: str) -> None:
    """perf_analyzer's random BOOL data is random bytes: any nonzero byte is a padding position."""
    x = np.random.default_rng(1).standard_normal((2, 5, 128)).astype(np.float32)
    raw = np.random.default_rng(2).integers(0, 256, (2, 5), np.uint8)
    module: Any = tg if protocol == "grpc" else th
    mask = module.InferInput("padding_mask", [2, 5], "BOOL")
    mask.set_data_from_numpy(np.zeros((2, 5), np.bool_))
    if protocol == "grpc":
        mask._raw_content = raw.tobytes()  # the bytes perf_analyzer sends, past tritonclient's own BOOL encoding
    else:
        mask._raw_data = raw.tobytes()
    inp = module.InferInput("input", [2, 5, 128], "FP32")
    inp.set_data_from_numpy(x)
    got = client(live_grpc, protocol).infer("encoder", [inp, mask]).as_numpy("output")
    want = infer(
        live_grpc,
        protocol,
        "encoder",
        {"input": x, "padding_mask": raw != 0},
        {"input": "FP32", "padding_mask": "BOOL"},
    )
    np.testing.assert_allclose(got, want.as_numpy("output"), atol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_random_fp32_bytes_that_are_nan_are_refused_naming_the_element(live_grpc: GrpcServer, protocol: str) -> None:
    x = np.frombuffer(b"\x00\x00\x80\x3f" + b"\xff\xff\xff\x7f" + bytes(4), np.float32).reshape(1, 3)  # 1, NaN, 0
    with pytest.raises(InferenceServerException) as e:
        infer(live_grpc, protocol, "layernorm", {"input": x}, {"input": "FP32"})
    assert (
        e.value.message()
        == "inputs.input: element [0, 1] = nan is outside float32's finite range (|x| <= 3.402823e+38)"
    )
