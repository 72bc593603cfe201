"""The drift monitor's cost per request (issue 36): a small and a large /normalize, an encoder's /encode and a text
encoder's /v1/embeddings, each against its own request's server CPU and against a small /normalize's.

In process, on the versions a server would load: each request answered once by its model as served, then the
monitor's work on that answer (app/server/pipeline.py's `observe`, what a sampled request pays in its thread) timed.
A pooled text also pays for keeping its statistics, which /v1/embeddings drops unless asked: that is timed as the
difference of its runs with and without them (interleaved, thread CPU medians). Over HTTP: one normserve worker on
the same repository with every request sampled (NORMSERVE_MONITOR_SAMPLE=1), closed loop at concurrency 1, its CPU
per request from /proc. Goal: the small /normalize's monitor cost at most 5% of its server CPU.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks import load, servers
from benchmarks.inprocess import measure, sample, shape_label
from benchmarks.serving import JSON, make_request
from benchmarks.targets import LARGE, SMALL

GOAL = 0.05  # of a small /normalize's server CPU, every request sampled (issue 36)
ENCODE: tuple[int, ...] = (1, 128, 128)  # one sequence of the default encoder's d_model
TEXTS = [  # a short /v1/embeddings request: four English sentences
    "The quick brown fox jumps over the lazy dog.",
    "Please restart the server after you update the configuration file.",
    "Our quarterly revenue grew by twelve percent compared with last year.",
    "The museum is closed on Mondays but open late on Thursday evenings.",
]
TEXT_MODEL = "text"  # the text encoder's name in the section's repository
Decode = Callable[[Any], Any]  # the served model -> its input, as the route's codec makes it


@dataclass(frozen=True)
class MonitorPlan:
    text_model: Path | None  # the text encoder's Hugging Face folder (all-MiniLM-L6-v2); None leaves its row out
    seconds: float = 5.0  # of HTTP load per request kind
    budget_s: float = 1.0  # per in-process measurement
    work_dir: Path = field(default_factory=lambda: servers.CACHE / "monitor")


@dataclass(frozen=True)
class Case:
    label: str
    model: str
    request: load.Request
    decode: Decode


def _normalize(shape: tuple[int, ...]) -> Case:
    from app.core.dataplane import NormalizeInput

    x = sample(shape)
    return Case(
        f"/normalize {shape_label(shape)}",
        "layernorm",
        make_request("/normalize JSON", x),
        lambda _: NormalizeInput(x, 1),
    )


def _encode(shape: tuple[int, ...]) -> Case:
    from app.core.dataplane import EncodeInput

    x = sample(shape)
    body = orjson.dumps({"data": x}, option=orjson.OPT_SERIALIZE_NUMPY)
    return Case(
        f"/encode {shape_label(shape)}",
        "encoder",
        load.Request("/encode", body, JSON),
        lambda m: EncodeInput(x, None, m.limits),
    )


def _embeddings(texts: list[str]) -> Case:
    from app.core.textbatching import Pooled

    def decode(model: Any) -> Any:
        t = model.tokenize(texts)
        return Pooled(t.input_ids, t.attention_mask, t.token_type_ids)  # as /v1/embeddings: statistics not asked

    body = orjson.dumps({"model": TEXT_MODEL, "input": texts})
    return Case(
        f"/v1/embeddings, {len(texts)} sentences", TEXT_MODEL, load.Request("/v1/embeddings", body, JSON), decode
    )


def cases(plan: MonitorPlan) -> list[Case]:
    """The section's rows, the small /normalize first (the goal's reference)."""
    found = [_normalize(SMALL), _normalize(LARGE), _encode(ENCODE)]
    return found + ([_embeddings(TEXTS)] if plan.text_model is not None else [])


def repository(plan: MonitorPlan, log: Callable[[str], None]) -> Path:
    """work_dir/models: the repo's layernorm and encoder (their baselines from `normserve export`), and the text
    encoder exported with its baseline on the parity texts; an export already there is reused."""
    repo = plan.work_dir / "models"
    for name in ("layernorm", "encoder"):
        shutil.rmtree(repo / name, ignore_errors=True)
        shutil.copytree(servers.ROOT / "models" / name, repo / name)
    if plan.text_model is not None and not (repo / TEXT_MODEL / "1" / "manifest.json").is_file():
        from app.export.textexport import export_text_encoder

        log(f"monitor: exporting {plan.text_model} as {TEXT_MODEL} ...")
        export_text_encoder(repo, TEXT_MODEL, plan.text_model, version=1)
    return repo


def inprocess(repo: Path, found: list[Case], budget_s: float) -> dict[str, dict[str, Any]]:
    """Per case: the monitor's work on one answer (us, median), the statistics a pooled text keeps for it (us),
    the positions counted and the LayerNorms they count in."""
    from app.core.modelmonitor import GATHER
    from app.core.runtime import Runtime
    from app.server.pipeline import monitored, observe
    from app.settings import Settings

    runtime = Runtime(Settings(model_dir=repo))
    runtime.load()
    rows = {}
    for case in found:
        model = runtime.get(case.model)
        assert model.monitor.layers, f"{case.model}: no baseline, nothing to monitor"
        plain = case.decode(model)
        request = monitored(plain)
        result = model.infer(request)
        first = next(iter(model.monitor.layers.values()))
        model.monitor.flush()
        before = first.samples()
        observe(model, request, result)
        model.monitor.flush()
        counted = first.samples() - before  # the positions one answer adds to each LayerNorm's window

        def gathering() -> None:
            """GATHER answers and their binning: the monitor bins a gathering at once (app/core/modelmonitor.py)."""
            for _ in range(GATHER):
                observe(model, request, result)  # noqa: B023 - run before the next case
            model.monitor.flush()  # noqa: B023

        timing = measure(gathering, budget_s)
        kept = _kept_statistics_s(model, plain, request, budget_s) if request is not plain else 0.0
        rows[case.label] = {"observe_us": timing.median_s / GATHER * 1e6, "kept_us": kept * 1e6, "positions": counted}
        rows[case.label]["layers"] = len(model.monitor.layers)
    return rows


def _kept_statistics_s(model: Any, plain: Any, request: Any, budget_s: float) -> float:
    """The thread CPU a pooled text's run takes more when it keeps its statistics: interleaved medians."""
    without: list[float] = []
    with_stats: list[float] = []
    stop = time.perf_counter() + budget_s
    while len(without) < 5 or (time.perf_counter() < stop and len(without) < 500):  # interleaved: drift cancels
        for req, times in ((plain, without), (request, with_stats)):
            start = time.thread_time()
            model.infer(req)
            times.append(time.thread_time() - start)
    return float(np.median(with_stats) - np.median(without))


def server_cpu(repo: Path, found: list[Case], seconds: float) -> dict[str, float]:
    """Per case: the server's CPU per request (us), one worker, every request sampled, concurrency 1."""
    cpu: dict[str, float] = {}
    env = {"NORMSERVE_MONITOR_SAMPLE": "1"}
    with servers.serve("normserve", env=env, model_dir=repo) as server:
        for case in found:
            load.check(server.port, case.request)  # a 200 before it is timed
            before = servers.cpu_seconds(server.pid)
            result = load.load(server.port, case.request, 1, seconds)
            cpu[case.label] = (servers.cpu_seconds(server.pid) - before) / max(result.requests, 1) * 1e6
            assert result.errors == 0, f"{case.label}: {result.errors} errors"
    return cpu


def monitor_section(plan: MonitorPlan, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The section's rows: in process, then over HTTP; each with its share of its own and a small request's CPU."""
    repo = repository(plan, log)
    found = cases(plan)
    log("monitor: in process")
    rows = inprocess(repo, found, plan.budget_s)
    log(f"monitor: over HTTP, {plan.seconds:g} s per request kind")
    cpu = server_cpu(repo, found, plan.seconds)
    small = cpu[found[0].label]
    out = []
    for case in found:
        row = rows[case.label] | {"request": case.label, "server_cpu_us": cpu[case.label]}
        row["monitor_us"] = row["observe_us"] + row["kept_us"]
        out.append(row | {"of_own": row["monitor_us"] / row["server_cpu_us"], "of_small": row["monitor_us"] / small})
    return out


def section(results: dict[str, Any]) -> list[str]:
    """docs/benchmarks.md's monitor section; the goal on the small /normalize's row."""
    from benchmarks.sections import table

    if "monitor" not in results:
        return []
    rows = results["monitor"]
    small = rows[0]
    verdict = "met" if small["of_small"] <= GOAL else "missed"
    return [
        "## The drift monitor's cost per request\n",
        "What a sampled request pays in its thread for the LayerNorm drift monitor (NORMSERVE_MONITOR_SAMPLE=1: "
        "every request): in process, the monitor's work on the request's answer (medians), plus for a pooled "
        "text the statistics its run keeps for the monitor; beside it, the request's server CPU over HTTP (one "
        f"worker, concurrency 1, /proc). Goal: at most {GOAL:.0%} of a small /normalize's server CPU: {verdict} "
        f"({small['of_small']:.1%}).\n",
        table(COLUMNS, (_cells(r) for r in rows)),
    ]


COLUMNS = [
    "request",
    "positions",
    "LayerNorms",
    "monitor us",
    "of which kept statistics us",
    "server CPU us",
    "of its CPU",
    "of a small /normalize's CPU",
]


def _cells(r: dict[str, Any]) -> list[Any]:
    monitor = [f"{r['monitor_us']:.3g}", f"{r['kept_us']:.3g}", f"{r['server_cpu_us']:.0f}"]
    return [r["request"], r["positions"], r["layers"], *monitor, f"{r['of_own']:.1%}", f"{r['of_small']:.1%}"]
