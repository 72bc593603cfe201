"""The sections of docs/benchmarks.md, a function each: its heading, what it measures, its table.

A section whose figures the run did not measure (`--sections`, `--quick`) is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from benchmarks import embedreport, monitorcost
from benchmarks.inprocess import TORCH, shape_label
from benchmarks.targets import half_pairs, tensor_mb

Results = dict[str, Any]
LOAD_COLUMNS = ["req/s", "p50 ms", "p99 ms", "server CPU ms/req", "errors"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def _load_cells(r: dict[str, Any]) -> list[Any]:
    cpu = r.get("cpu_ms_per_request", float("nan"))
    return [f"{r['rps']:.1f}", f"{r['p50_ms']:.3g}", f"{r['p99_ms']:.3g}", f"{cpu:.3g}", r["errors"]]


def table(header: list[str], rows: Iterable[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def sections(results: Results) -> list[str]:
    """Every section the results hold, in the report's order; the floors of section 2 come with its codecs."""
    steps: list[Callable[[Results], list[str]]] = [_floor, _threads, _stats_cost, _encoder_torch, _codecs]
    if "codecs" in results:
        steps += [_json_floor, _binary_floor]
    steps += [_http, _half, _batching, _merged_runs, monitorcost.section, _memory, embedreport.section, _fidelity]
    return [part for step in steps for part in step(results)]


def _floor(results: Results) -> list[str]:
    if "floor" not in results:
        return []
    return [
        "## 1. In process: the floor\n",
        "Layer norm over the last dim (eps 1e-5), float32 in. The conditioned path is what `/normalize` runs: "
        "exact per-row scaling and centering, then the graph, with float64 statistics.\n",
        table(
            ["shape", "method", "median ms", "p99 ms", "GB/s", "runs"],
            (
                [
                    shape_label(r["shape"]),
                    r["method"],
                    _ms(r["median_s"]),
                    _ms(r["p99_s"]),
                    f"{r['gbps']:.2f}",
                    r["runs"],
                ]
                for r in results["floor"]
            ),
        ),
    ]


def _threads(results: Results) -> list[str]:
    if "threads" not in results:
        return []
    return [
        "### onnxruntime intra-op threads\n",
        "The plain session call with 1 or 2 intra-op threads: alone, and with two callers at once "
        "(as two workers, or two requests in one worker, would be).\n",
        table(
            ["shape", "threads", "alone: median ms", "alone: p99 ms", "two callers: ms per run"],
            (
                [
                    shape_label(r["shape"]),
                    r["threads"],
                    _ms(r["median_s"]),
                    _ms(r["p99_s"]),
                    _ms(r["two_callers_per_run_s"]),
                ]
                for r in sorted(results["threads"], key=lambda r: (r["shape"], r["threads"]))
            ),
        ),
    ]


def _stats_cost(results: Results) -> list[str]:
    if "stats_cost" not in results:
        return []
    return [
        "### Cost of the statistics outputs\n",
        table(
            ["shape", "output only: ms", "output + mean + inv_std_dev: ms", "overhead"],
            (
                [shape_label(r["shape"]), _ms(r["output_s"]), _ms(r["all_s"]), f"{r['all_s'] / r['output_s'] - 1:+.1%}"]
                for r in results["stats_cost"]
            ),
        ),
    ]


def _encoder_torch(results: Results) -> list[str]:
    if "encoder_torch" not in results:
        return []
    return [
        "### The encoder in process against torch's\n",
        "normserve's encoder run (the one onnxruntime run /encode makes, output and statistics, without the "
        "batcher's queue delay) and app/export/modules.py's `Encoder` with the same weights.npz, both at one "
        "intra-op thread; medians.\n",
        table(
            ["shape", "normserve ms", "torch ms", "ratio"],
            (
                [shape_label(r["shape"]), _ms(r["ours_s"]), _ms(r["torch_s"]), f"{r['ours_s'] / r['torch_s']:.2f}"]
                for r in results["encoder_torch"]
            ),
        ),
    ]


def _codecs(results: Results) -> list[str]:
    if "codecs" not in results:
        return []
    return [
        "## 2. Codec costs\n",
        "Decoding a request into a float32 array and encoding the response tensor, in process.\n",
        table(
            ["shape", "codec", "decode ms", "encode ms", "total ms"],
            (
                [
                    shape_label(r["shape"]),
                    r["method"],
                    _ms(r["decode_s"]),
                    _ms(r["encode_s"]),
                    _ms(r["decode_s"] + r["encode_s"]),
                ]
                for r in results["codecs"]
            ),
        ),
    ]


def _json_floor(results: Results) -> list[str]:
    if "json_floor" not in results:
        return []
    f = results["json_floor"]
    rows = [[k, _ms(v)] for k, v in f.items() if k not in ("body_bytes", "shape")]
    return [f"### In-process sum of a JSON request, {shape_label(tuple(f['shape']))}\n", table(["part", "ms"], rows)]


def _binary_floor(results: Results) -> list[str]:
    if "binary_floor" not in results:
        return []
    f = results["binary_floor"]
    return [
        f"### The floor of a V2 binary request, {shape_label(tuple(f['shape']))}\n",
        "The request's bytes over a raw 127.0.0.1 socket to a thread that copies the tensor out of them, runs "
        f"{TORCH} (1 thread) and sends the answer's bytes back (one copy out): what V2 binary over HTTP "
        "cannot beat. The gRPC floor is a server of section 3 (`floor: grpcio`).\n",
        table(["p50 ms", "p99 ms", "runs"], [[f"{f['p50_ms']:.3g}", f"{f['p99_ms']:.3g}", f["runs"]]]),
    ]


def _http(results: Results) -> list[str]:
    if "http" not in results:
        return []
    return [
        "## 3. Over HTTP on 127.0.0.1\n",
        "The second view, unpinned (the headline above pins each server to one core): "
        f"closed loop, {results['meta']['http_seconds']:g} s per cell, one worker per server, the client in the "
        "benchmark's process on the same 2 cores. normserve answers `output` plus statistics; the peers "
        "`output` only (the V2 requests ask for `output` alone). Server CPU is the server process's user + "
        "system time per request (/proc/PID/stat), which other load on the machine disturbs least. The gRPC rows "
        "are ModelInfer with raw tensors, from grpc.aio clients (one channel each, the request serialized once), "
        "a heavier client than the raw HTTP loop. MLServer 1.7.1 runs with its defaults but parallel_workers=0 "
        "(its default, 1, does not start with today's uvloop: MLServer issue #2286) and host 127.0.0.1; its "
        "custom model answers `output`, mean, var and std as /normalize does. Floors: `trivial` is an ASGI "
        "app on normserve's uvicorn command line fed the same /normalize body, answering a constant; "
        "`floor: grpcio` a minimal grpcio server (parse, torch layer_norm, answer). `normserve, tracing on` "
        "exports a span per request over OTLP/HTTP to a receiver on loopback that answers 200.\n",
        table(
            ["server", "protocol", "shape", "concurrency", *LOAD_COLUMNS, "requests"],
            (
                [r["server"], r["protocol"], shape_label(r["shape"]), r["concurrency"], *_load_cells(r), r["requests"]]
                for r in results["http"]
            ),
        ),
    ]


def _batching(results: Results) -> list[str]:
    if "batching" not in results:
        return []
    return [
        "## 4. /encode with dynamic batching off and on\n",
        f"Off: NORMSERVE_BATCH_MAX_SIZE=1. On: {results['meta']['batching_on']}, so that every shape is merged "
        "and the table shows where merging pays; the defaults (8, 2000, NORMSERVE_BATCH_MAX_SEQ_LEN=64) merge "
        "only sequences up to 64. Requests per run comes from the server's /metrics.\n",
        table(
            ["shape", "batching", "concurrency", *LOAD_COLUMNS, "requests per run"],
            (
                [
                    shape_label(r["shape"]),
                    r["batching"],
                    r["concurrency"],
                    *_load_cells(r),
                    f"{r.get('requests_per_run', float('nan')):.2f}",
                ]
                for r in sorted(results["batching"], key=lambda r: (r["shape"], r["concurrency"], r["batching"]))
            ),
        ),
    ]


def _merged_runs(results: Results) -> list[str]:
    if "merged_runs" not in results:
        return []
    return [
        "### In process: one merged run against separate runs\n",
        "Thread CPU time of the encoder (one intra-op thread), interleaved medians: what merging saves "
        "before JSON and HTTP, and why sequences over NORMSERVE_BATCH_MAX_SEQ_LEN (64) are not merged.\n",
        table(
            ["seq length", "8 runs of 1 sequence: ms", "1 run of 8: ms", "merged / separate"],
            ([r["seq"], _ms(r["alone_s"]), _ms(r["merged_s"]), f"{r['ratio']:.2f}"] for r in results["merged_runs"]),
        ),
    ]


def _memory(results: Results) -> list[str]:
    if "memory" not in results:
        return []
    return [
        "## 5. Peak memory of a worker serving one large request\n",
        "VmHWM of a fresh single-worker server, read from /proc/PID/status after the request; idle is its "
        "VmRSS after start-up and one small request.\n",
        table(
            ["request", "body MiB", "idle RSS MiB", "peak RSS MiB", "peak / body", "(peak - idle) / body", "s"],
            (_memory_row(r) for r in results["memory"]),
        ),
    ]


def _memory_row(r: dict[str, Any]) -> list[Any]:
    body, idle, peak = r["payload_bytes"], r["idle_rss_bytes"], r["peak_rss_bytes"]
    return [
        r["protocol"],
        f"{body / 2**20:.1f}",
        f"{idle / 2**20:.0f}",
        f"{peak / 2**20:.0f}",
        f"{peak / body:.2f}",
        f"{(peak - idle) / body:.2f}",
        f"{r['seconds']:.2f}",
    ]


def _fidelity(results: Results) -> list[str]:
    return ["## Fidelity\n", f"{results['fidelity']}\n"] if "fidelity" in results else []


def _half(results: Results) -> list[str]:
    """normserve's V2 binary FP32 and FP16 rows of section 3 side by side, per byte of tensor moved."""
    rows = []
    for cell in (c for pair in half_pairs(results) for c in pair):
        mb = tensor_mb(cell)
        dtype = "FP16" if cell["protocol"] != "V2 binary" else "FP32"
        per = [f"{mb:.2f}", f"{cell['rps'] * mb:.0f}", f"{cell['p50_ms'] / mb:.3g}"]
        rows.append([shape_label(cell["shape"]), dtype, cell["concurrency"], f"{cell['rps']:.1f}", *per])
    if not rows:
        return []
    return [
        "## Half precision: V2 binary FP16 beside FP32, per byte moved\n",
        "The same rows as section 3's normserve V2 binary rows (the FP16 request is the FP32 sample rounded to "
        "FP16, answered in FP16 and checked within one FP16 ulp of float64 LayerNorm before it is timed). Bytes "
        "moved: the input tensor in and the output tensor back.\n",
        table(["shape", "datatype", "concurrency", "req/s", "tensor MB per request", "MB/s", "p50 ms per MB"], rows),
    ]
