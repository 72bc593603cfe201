"""Sections 1 and 2, in process: the compute floor (NumPy, torch, onnxruntime, memcpy) and the codec costs."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
from pydantic import TypeAdapter

from app.core import reference
from app.core.dataplane import NormalizeInput, NormalizeOutput
from app.core.encoder import EncoderModel
from app.core.model import Model
from app.core.runtime import Runtime
from app.core.tensors import dumps, encode_json_tensor
from app.server.api.rest.codec import NORMALIZE_TENSORS, NormalizeParams, decode_normalize
from app.server.api.rest.fields import read
from app.server.api.v2.http import codec as v2_codec
from app.settings import Settings

TORCH = "torch.nn.functional.layer_norm"


@dataclass(frozen=True)
class Timing:
    median_s: float
    p99_s: float
    runs: int

    def gbps(self, nbytes: int) -> float:
        return nbytes / self.median_s / 1e9 if self.median_s > 0 else float("nan")


def measure(fn: Callable[[], object], budget_s: float, max_runs: int = 2000, min_runs: int = 3) -> Timing:
    """Median and p99 of fn, one warm-up call, then runs until the budget or max_runs (at least min_runs)."""
    fn()
    times: list[float] = []
    stop = time.perf_counter() + budget_s
    while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() < stop):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    arr = np.asarray(times)
    return Timing(float(np.median(arr)), float(np.percentile(arr, 99)), len(times))


def sample(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def plain_feeds(x: np.ndarray) -> dict[str, np.ndarray]:
    """The exported layernorm graph's inputs for x's last dim: gamma 1, beta 0, eps 1e-5 in mode var."""
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    R, D = rows.shape
    return {
        "input": rows,
        "gamma": np.ones(D, np.float32),
        "beta": np.zeros(D, np.float32),
        "eps_var": np.full((R, 1), 1e-5, np.float32),
        "eps_std": np.zeros((R, 1), np.float32),
    }


def session(path: str, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])


def _torch_rows(x: np.ndarray, budget_s: float) -> list[dict[str, Any]]:
    """torch.nn.functional.layer_norm with its default intra-op threads and with one (when torch is installed)."""
    try:
        import torch
    except ImportError:
        return []
    t = torch.from_numpy(x)
    default = torch.get_num_threads()
    rows = []
    try:
        for n in sorted({default, 1}, reverse=True):
            torch.set_num_threads(n)
            timing = measure(lambda: torch.nn.functional.layer_norm(t, (x.shape[-1],), eps=1e-5), budget_s)
            method = f"{TORCH}, {n} thread{'s' if n > 1 else ''}"
            rows.append({"shape": x.shape, "method": method, "bytes": x.nbytes, **_timing_row(timing, x.nbytes)})
    finally:
        torch.set_num_threads(default)
    return rows


def floor(runtime: Runtime, shapes: list[tuple[int, ...]], budget_s: float) -> list[dict[str, Any]]:
    """Section 1: the same layer norm by every means in process, and a memcpy of the same bytes."""
    model = runtime.get("layernorm")
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        x = sample(shape)
        for method, fn in _floor_cases(model, x).items():
            t = measure(fn, budget_s)
            rows.append({"shape": shape, "method": method, "bytes": x.nbytes, **_timing_row(t, x.nbytes)})
        rows += _torch_rows(x, budget_s)
    return rows


def _floor_cases(model: Model, x: np.ndarray) -> dict[str, Callable[[], object]]:
    sess = model.session
    dst = np.empty_like(x)
    feeds = plain_feeds(x)
    return {
        "memory copy": lambda: np.copyto(dst, x),
        "NumPy reference (float64)": lambda: reference.layer_norm(x, 1, 1e-5, "var"),
        "onnxruntime, plain session call": lambda: sess.run(["output"], feeds),
        "onnxruntime, our conditioned path": lambda: model.infer(NormalizeInput(x, 1)),
    }


def threads(model_path: str, shapes: list[tuple[int, ...]], budget_s: float) -> list[dict[str, Any]]:
    """Intra-op threads 1 vs 2: one caller alone, and two callers at once (two workers, or two requests)."""
    out: list[dict[str, Any]] = []
    for n in (1, 2):
        sess = session(model_path, n)
        for shape in shapes:
            run = partial(sess.run, ["output"], plain_feeds(sample(shape)))
            alone = measure(run, budget_s)
            pair = _two_callers(run, budget_s)
            out.append({"threads": n, "shape": shape, **_timing_row(alone, 0), "two_callers_per_run_s": pair})
    return out


def _two_callers(fn: Callable[[], object], budget_s: float) -> float:
    """Seconds per run when two threads call fn back to back at once (throughput of a busy worker pair)."""
    counts = [0, 0]
    stop = time.perf_counter() + max(budget_s, 0.05)

    def loop(i: int) -> None:
        while time.perf_counter() < stop or counts[i] == 0:
            fn()
            counts[i] += 1

    fn()
    start = time.perf_counter()
    workers = [threading.Thread(target=loop, args=(i,)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return (time.perf_counter() - start) / sum(counts)


def stats_cost(runtime: Runtime, shapes: list[tuple[int, ...]], budget_s: float) -> list[dict[str, Any]]:
    """The graph's Mean and InvStdDev outputs against the plain output alone."""
    sess = runtime.get("layernorm").session
    rows = []
    for shape in shapes:
        feeds = plain_feeds(sample(shape))
        only: list[float] = []
        every: list[float] = []
        sess.run(None, feeds)
        stop = time.perf_counter() + 2 * budget_s
        while len(only) < 3 or (time.perf_counter() < stop and len(only) < 2000):  # interleaved: drift cancels
            for names, times in ((["output"], only), (None, every)):
                start = time.perf_counter()
                sess.run(names, feeds)
                times.append(time.perf_counter() - start)
        rows.append({"shape": shape, "output_s": float(np.median(only)), "all_s": float(np.median(every))})
    return rows


def codecs(
    runtime: Runtime, settings: Settings, shapes: list[tuple[int, ...]], budget_s: float
) -> list[dict[str, Any]]:
    """Section 2: request decode + response encode of the same tensor, three ways."""
    naive = TypeAdapter(list[list[list[float]]])
    model = runtime.get("layernorm")
    rows = []
    for shape in shapes:
        x = sample(shape)
        for method, (decode, encode) in _codec_cases(x, settings, model, naive).items():
            # The naive path on the largest shape takes seconds a call: fewer runs there.
            d = measure(decode, budget_s, min_runs=1 if x.nbytes > 1 << 24 else 3)
            e = measure(encode, budget_s, min_runs=1 if x.nbytes > 1 << 24 else 3)
            rows.append(
                {"shape": shape, "method": method, "bytes": x.nbytes, "decode_s": d.median_s, "encode_s": e.median_s}
            )
    return rows


def _codec_cases(
    x: np.ndarray, settings: Settings, model: Model, naive: TypeAdapter[list[list[list[float]]]]
) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """Each way's (decode the request, encode the response) of the same tensor x."""
    body = dumps({"data": x})
    header, blob = binary_request(x)
    return {
        "ours, JSON (orjson into NumPy)": (
            lambda: decode_normalize(read(body, NormalizeParams, NORMALIZE_TENSORS), model, settings),
            lambda: dumps({"output": encode_json_tensor(x)}),
        ),
        "ours, V2 binary": (
            lambda: v2_codec.decode(bytearray(header + blob), str(len(header)), model, settings),
            lambda: _v2_binary_response(model, x),
        ),
        "naive: json + pydantic list[list[list[float]]]": (
            lambda: np.asarray(naive.validate_python(json.loads(body)["data"]), np.float32),
            lambda: json.dumps({"output": x.tolist()}),
        ),
    }


def binary_request(x: np.ndarray, datatype: str = "FP32") -> tuple[bytes, bytes]:
    """A V2 binary infer request for layernorm: the JSON header and the raw bytes after it (x of datatype)."""
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": datatype,
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    )
    return header, x.tobytes()


def _v2_binary_response(model: Model, x: np.ndarray) -> bytes:
    req = v2_codec.InferRequest(None, None, "FP32", [("output", True)])
    stats = np.zeros(x.shape[:-1])
    out = NormalizeOutput(x, stats, stats, 1e-5, "var", "onnxruntime", model.info, None)
    return v2_codec.encode(model, req, out, None).body


def json_request_floor(runtime: Runtime, shape: tuple[int, ...], budget_s: float) -> dict[str, float]:
    """The in-process sum a JSON /normalize request cannot beat: orjson decode, array, onnxruntime, orjson encode."""
    x = sample(shape)
    body = dumps({"data": x})
    sess = runtime.get("layernorm").session
    feeds = plain_feeds(x)
    (out,) = sess.run(["output"], feeds)
    doc = orjson.loads(body)["data"]
    parts = {
        "orjson decode": measure(lambda: orjson.loads(body), budget_s).median_s,
        "array conversion": measure(lambda: np.asarray(doc, np.float32), budget_s).median_s,
        "onnxruntime": measure(lambda: sess.run(["output"], feeds), budget_s).median_s,
        "orjson encode": measure(lambda: dumps({"output": out.reshape(shape)}), budget_s).median_s,
    }
    return {**parts, "sum": sum(parts.values()), "body_bytes": float(len(body))}


def _timing_row(t: Timing, nbytes: int) -> dict[str, Any]:
    row: dict[str, Any] = {"median_s": t.median_s, "p99_s": t.p99_s, "runs": t.runs}
    if nbytes:
        row["gbps"] = t.gbps(nbytes)
    return row


def shape_label(shape: tuple[int, ...]) -> str:
    return "(" + ",".join(str(d) for d in shape) + f") {math.prod(shape) * 4 / 2**20:.3g} MiB"


def merged_runs(runtime: Runtime, seqs: list[int], budget_s: float, batch: int = 8) -> list[dict[str, Any]]:
    """Thread CPU time of `batch` runs of one sequence against one run of `batch`, per seq length (the encoder)."""
    model = runtime.get("encoder")
    assert isinstance(model, EncoderModel)
    names = model.output_names
    rows = []
    for seq in seqs:
        one, many = sample((1, seq, 128)), sample((batch, seq, 128))
        alone: list[float] = []
        merged: list[float] = []
        stop = time.perf_counter() + budget_s
        while len(alone) < 5 or (time.perf_counter() < stop and len(alone) < 200):  # interleaved: drift cancels
            start = time.thread_time()
            for _ in range(batch):
                model.session.run(names, {"input": one, "padding_mask": np.zeros((1, seq), bool)})
            alone.append(time.thread_time() - start)
            start = time.thread_time()
            model.session.run(names, {"input": many, "padding_mask": np.zeros((batch, seq), bool)})
            merged.append(time.thread_time() - start)
        a, m = float(np.median(alone)), float(np.median(merged))
        rows.append({"seq": seq, "batch": batch, "alone_s": a, "merged_s": m, "ratio": m / a})
    return rows
