"""docs/benchmarks.md (a table per section, the targets, the machine) and docs/benchmarks.png."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.inprocess import TORCH, shape_label
from benchmarks.targets import COLUMNS, evaluate, half_pairs, tensor_mb


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


LOAD_COLUMNS = ["req/s", "p50 ms", "p99 ms", "server CPU ms/req", "errors"]


def _load_cells(r: dict[str, Any]) -> list[Any]:
    cpu = r.get("cpu_ms_per_request", float("nan"))
    return [f"{r['rps']:.1f}", f"{r['p50_ms']:.3g}", f"{r['p99_ms']:.3g}", f"{cpu:.3g}", r["errors"]]


def _table(header: list[str], rows: Iterable[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_markdown(results: dict[str, Any], path: Path, png_name: str) -> None:
    meta = results["meta"]
    parts = [
        "# Benchmarks\n",
        "Reproduce with `normserve bench` (about 20 minutes; `--quick` under 3). It starts and stops every "
        "server itself on 127.0.0.1, one worker each, and creates the KServe and MLServer peers' venvs under "
        "`.bench/` (a quick run uses them only if present, or with `--with-kserve` / `--with-mlserver`). "
        "Raw figures: [benchmarks.json](benchmarks.json).\n",
        f"Written by `{meta['command']}` on {meta['date']} ({meta['mode']} run, {meta['seconds']:.0f} s in all). "
        "Every figure below comes from that one run on one machine, so the ratios compare like with like.\n",
    ]
    if meta.get("note"):
        parts.append(f"**Note:** {meta['note']}\n")
    machine = [[k, v] for k, v in meta["machine"].items()] + [[k, v] for k, v in meta["versions"].items()]
    parts += ["## Machine and versions\n", _table(["", ""], machine)]
    parts += ["## Targets\n", _table(COLUMNS, evaluate(results))]
    parts += _sections(results)
    parts.append(f"\n![latency against payload size]({png_name})\n")
    notes = Path(__file__).with_name("notes.md")
    if notes.is_file():  # the hand-written reading of the profiles, the same in every run's report
        parts.append(notes.read_text())
    path.write_text("\n".join(parts))


def _sections(results: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if "floor" in results:
        out += [
            "## 1. In process: the floor\n",
            "Layer norm over the last dim (eps 1e-5), float32 in. The conditioned path is what `/normalize` runs: "
            "exact per-row scaling and centering, then the graph, with float64 statistics.\n",
            _table(
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
    if "threads" in results:
        out += [
            "### onnxruntime intra-op threads\n",
            "The plain session call with 1 or 2 intra-op threads: alone, and with two callers at once "
            "(as two workers, or two requests in one worker, would be).\n",
            _table(
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
    if "stats_cost" in results:
        out += [
            "### Cost of the statistics outputs\n",
            _table(
                ["shape", "output only: ms", "output + mean + inv_std_dev: ms", "overhead"],
                (
                    [
                        shape_label(r["shape"]),
                        _ms(r["output_s"]),
                        _ms(r["all_s"]),
                        f"{r['all_s'] / r['output_s'] - 1:+.1%}",
                    ]
                    for r in results["stats_cost"]
                ),
            ),
        ]
    out += _encoder_torch(results)
    if "codecs" in results:
        out += [
            "## 2. Codec costs\n",
            "Decoding a request into a float32 array and encoding the response tensor, in process.\n",
            _table(
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
        out += _floors(results)
    out += _http(results)
    out += _half(results)
    return out


def _half(results: dict[str, Any]) -> list[str]:
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
        _table(["shape", "datatype", "concurrency", "req/s", "tensor MB per request", "MB/s", "p50 ms per MB"], rows),
    ]


def _floors(results: dict[str, Any]) -> list[str]:
    out = []
    if "json_floor" in results:
        f = results["json_floor"]
        rows = [[k, _ms(v)] for k, v in f.items() if k not in ("body_bytes", "shape")]
        out += [
            f"### In-process sum of a JSON request, {shape_label(tuple(f['shape']))}\n",
            _table(["part", "ms"], rows),
        ]
    if "binary_floor" in results:
        f = results["binary_floor"]
        out += [
            f"### The floor of a V2 binary request, {shape_label(tuple(f['shape']))}\n",
            "The request's bytes over a raw 127.0.0.1 socket to a thread that copies the tensor out of them, runs "
            f"{TORCH} (1 thread) and sends the answer's bytes back (one copy out): what V2 binary over HTTP "
            "cannot beat. The gRPC floor is a server of section 3 (`floor: grpcio`).\n",
            _table(["p50 ms", "p99 ms", "runs"], [[f"{f['p50_ms']:.3g}", f"{f['p99_ms']:.3g}", f["runs"]]]),
        ]
    return out


def _encoder_torch(results: dict[str, Any]) -> list[str]:
    if "encoder_torch" not in results:
        return []
    return [
        "### The encoder in process against torch's\n",
        "normserve's encoder run (the one onnxruntime run /encode makes, output and statistics, without the "
        "batcher's queue delay) and app/export/modules.py's `Encoder` with the same weights.npz, both at one "
        "intra-op thread; medians.\n",
        _table(
            ["shape", "normserve ms", "torch ms", "ratio"],
            (
                [shape_label(r["shape"]), _ms(r["ours_s"]), _ms(r["torch_s"]), f"{r['ours_s'] / r['torch_s']:.2f}"]
                for r in results["encoder_torch"]
            ),
        ),
    ]


def _http(results: dict[str, Any]) -> list[str]:
    out = []
    if "http" in results:
        out += [
            "## 3. Over HTTP on 127.0.0.1\n",
            f"Closed loop, {results['meta']['http_seconds']:g} s per cell, one worker per server, the client in the "
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
            _table(
                ["server", "protocol", "shape", "concurrency", *LOAD_COLUMNS, "requests"],
                (
                    [
                        r["server"],
                        r["protocol"],
                        shape_label(r["shape"]),
                        r["concurrency"],
                        *_load_cells(r),
                        r["requests"],
                    ]
                    for r in results["http"]
                ),
            ),
        ]
    if "batching" in results:
        out += [
            "## 4. /encode with dynamic batching off and on\n",
            f"Off: NORMSERVE_BATCH_MAX_SIZE=1. On: {results['meta']['batching_on']}, so that every shape is merged "
            "and the table shows where merging pays; the defaults (8, 2000, NORMSERVE_BATCH_MAX_SEQ_LEN=64) merge "
            "only sequences up to 64. Requests per run comes from the server's /metrics.\n",
            _table(
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
    if "merged_runs" in results:
        out += [
            "### In process: one merged run against separate runs\n",
            "Thread CPU time of the encoder (one intra-op thread), interleaved medians: what merging saves "
            "before JSON and HTTP, and why sequences over NORMSERVE_BATCH_MAX_SEQ_LEN (64) are not merged.\n",
            _table(
                ["seq length", "8 runs of 1 sequence: ms", "1 run of 8: ms", "merged / separate"],
                (
                    [r["seq"], _ms(r["alone_s"]), _ms(r["merged_s"]), f"{r['ratio']:.2f}"]
                    for r in results["merged_runs"]
                ),
            ),
        ]
    if "memory" in results:
        out += [
            "## 5. Peak memory of a worker serving one large request\n",
            "VmHWM of a fresh single-worker server, read from /proc/PID/status after the request; idle is its "
            "VmRSS after start-up and one small request.\n",
            _table(
                ["request", "body MiB", "idle RSS MiB", "peak RSS MiB", "peak / body", "(peak - idle) / body", "s"],
                (
                    [
                        r["protocol"],
                        f"{r['payload_bytes'] / 2**20:.1f}",
                        f"{r['idle_rss_bytes'] / 2**20:.0f}",
                        f"{r['peak_rss_bytes'] / 2**20:.0f}",
                        f"{r['peak_rss_bytes'] / r['payload_bytes']:.2f}",
                        f"{(r['peak_rss_bytes'] - r['idle_rss_bytes']) / r['payload_bytes']:.2f}",
                        f"{r['seconds']:.2f}",
                    ]
                    for r in results["memory"]
                ),
            ),
        ]
    if "fidelity" in results:
        out += ["## Fidelity\n", f"{results['fidelity']}\n"]
    return out


def write_plot(results: dict[str, Any], path: Path) -> None:
    """Median latency against payload bytes: in process (left) and over HTTP at concurrency 1 (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    series: dict[str, list[tuple[int, float]]] = {}
    for r in results.get("floor", []):
        series.setdefault(r["method"], []).append((r["bytes"], r["median_s"] * 1e3))
    _lines(left, series, "in process: median latency")
    series = {}
    for r in results.get("http", []):
        if r["concurrency"] == min(x["concurrency"] for x in results["http"]):
            nbytes = 4 * math.prod(r["shape"])
            series.setdefault(f"{r['server']}: {r['protocol']}", []).append((nbytes, r["p50_ms"]))
    _lines(right, series, "over HTTP, concurrency 1: p50 latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _lines(ax: Any, series: dict[str, list[tuple[int, float]]], title: str) -> None:
    for label, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("payload, bytes of float32")
    ax.set_ylabel("ms")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if series:
        ax.legend(fontsize=7)
