"""The embeddings section (issue 39): sentences per second per core of a text encoder, against what people run instead.

Rows: the floor (the same model through plain `torch.onnx.export`, onnxruntime at one thread, the fast tokenizer,
mean pooling in NumPy, a Python loop, no HTTP), normserve's text-encoder model kind in process, sentence-transformers
behind FastAPI, Infinity (its own venv, as MLServer's) and normserve's POST /v1/embeddings. Every server runs pinned
to one core (`taskset -c`), the load (2 closed-loop clients, requests of 32 texts cycling over the 256) on the
other; the in-process rows run in this process pinned to the servers' core. The servers stay up together and take
turns each round, so a neighbour's load on a shared machine falls on all alike; figures are medians of the rounds.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import servers
from benchmarks.embedfloor import (
    Floor,
    batches,
    export_floor,
    lone_p50,
    rate,
    served_embed,
    served_models,
    stage_profile,
)
from benchmarks.embedload import cell, short_p50
from benchmarks.embedpeers import Running, answer, ensure_infinity, start, worst_cosine
from benchmarks.embedrows import (
    FLOOR,
    INFINITY,
    INPROCESS,
    INPROCESS_INT8,
    NORMSERVE,
    NORMSERVE_INT8,
    SHORT_TEXT,
    EmbeddingsPlan,
    texts,
)
from benchmarks.pinned import cores


def prepare_models(plan: EmbeddingsPlan, log: Callable[[str], None]) -> tuple[Path, dict[str, str]]:
    """normserve's repository of the model (FP32 as `minilm`, INT8 as `minilm-int8` when the export lets it
    through) and the floor's graph; the reasons rows are left out."""
    from app.export.textexport import export_text_encoder

    if plan.repo is not None:
        found = {INPROCESS_INT8: (plan.repo / "minilm-int8").is_dir()}
        return plan.repo, {} if found[INPROCESS_INT8] else dict.fromkeys((INPROCESS_INT8, NORMSERVE_INT8), "absent")
    repo, skipped = plan.work_dir / "models", {}
    if repo.exists():
        import shutil

        shutil.rmtree(repo)
    log(f"embeddings: exporting {plan.model_path} with normserve (FP32) ...")
    export_text_encoder(repo, "minilm", plan.model_path)
    if plan.quantize:
        log("embeddings: exporting it again with --quantize int8 ...")
        try:
            export_text_encoder(repo, "minilm-int8", plan.model_path, quantize="int8")
        except Exception as e:  # a refusal (cosine below its bound) leaves the INT8 rows out, said why
            skipped[INPROCESS_INT8] = skipped[NORMSERVE_INT8] = f"export --quantize int8 refused: {e}"
    else:
        skipped[INPROCESS_INT8] = skipped[NORMSERVE_INT8] = "not asked (plan.quantize false)"
    return repo, skipped


def embeddings_section(plan: EmbeddingsPlan, log: Callable[[str], None]) -> dict[str, Any]:
    """Every row of the plan, the HTTP ones pinned per core, interleaved over the rounds; medians per row."""
    server_core, load_core = cores()
    groups = batches(texts(plan.n_texts, *plan.words), plan.batch)
    repo, skipped = prepare_models(plan, log)
    floor = Floor(export_floor(plan.model_path, plan.work_dir), plan.model_path)
    want = np.concatenate([floor.embed(g) for g in groups])
    models = served_models(repo)
    inprocess = inprocess_rows(floor, models, skipped)
    names = server_names(plan, skipped, log)
    runs: dict[str, list[dict[str, Any]]] = {}
    with ExitStack() as stack:
        running = start_servers(stack, names, plan, repo, server_core, groups[0], want, skipped)
        with pinned(server_core):
            short = {name: lone_p50(embed, SHORT_TEXT, plan.short_requests) for name, embed in inprocess.items()}
        for round_ in range(plan.rounds):
            with pinned(server_core):
                inprocess_round(inprocess, groups, plan, round_, runs, log)
            with pinned(load_core):
                http_round(running, groups, plan, round_, runs, log)
        with pinned(load_core):
            short |= {name: short_p50(srv, plan.short_requests) for name, srv in running.items()}
        rss = {name: servers.memory_kib(srv.server.pid).get("VmRSS", 0) * 1024 for name, srv in running.items()}
    with pinned(server_core):
        profile = stage_profile(models["minilm"], groups)
    return {
        "server_cpu": server_core,
        "load_cpu": load_core,
        "rounds": plan.rounds,
        "seconds": plan.seconds,
        "texts": plan.n_texts,
        "batch": plan.batch,
        "concurrency": plan.concurrency,
        "rows": [_median(name, rows) for name, rows in runs.items()],
        "short_p50_ms": {name: s * 1e3 for name, s in short.items()},
        "rss_bytes": rss,
        "weights_bytes": (repo / "minilm" / "1" / "model.onnx").stat().st_size,
        "skipped": skipped,
        "profile": profile,
    }


def server_names(plan: EmbeddingsPlan, skipped: dict[str, str], log: Callable[[str], None]) -> list[str]:
    """The plan's servers, normserve's INT8 with normserve's when quantizing; Infinity's venv made ready (or its
    row left out, said why)."""
    names = list(plan.servers) + ([NORMSERVE_INT8] if NORMSERVE in plan.servers and plan.quantize else [])
    if INFINITY in names:
        why = ensure_infinity(log)
        if why:
            skipped[INFINITY] = why
    return names


@contextmanager
def pinned(core: int) -> Iterator[None]:
    """This process on one core for the block, its affinity given back after (the in-process rows and the load)."""
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, affinity)


def inprocess_rows(
    floor: Floor, models: dict[str, Any], skipped: dict[str, str]
) -> dict[str, Callable[[Sequence[str]], np.ndarray]]:
    """The floor's loop and normserve's model kind (FP32, INT8 unless its export was refused), by row."""
    inprocess: dict[str, Callable[[Sequence[str]], np.ndarray]] = {FLOOR: floor.embed}
    inprocess[INPROCESS] = served_embed(models["minilm"])
    if INPROCESS_INT8 not in skipped:
        inprocess[INPROCESS_INT8] = served_embed(models["minilm-int8"])
    return inprocess


def start_servers(
    stack: ExitStack,
    names: list[str],
    plan: EmbeddingsPlan,
    repo: Path,
    core: int,
    group: list[str],
    want: np.ndarray,
    skipped: dict[str, str],
) -> dict[str, Running]:
    """The servers that start and answer; one that does not is left out (said why), one that answers wrong stops
    the section: a throughput of wrong embeddings is no figure."""
    running: dict[str, Running] = {}
    for name in names:
        if name in skipped:
            continue
        try:
            running[name] = stack.enter_context(start(name, plan, repo, core))
        except RuntimeError as e:
            skipped[name] = f"did not start: {str(e)[:300]}"
            continue
        status, got = answer(running[name], group)
        if status != 200 or got is None:
            skipped[name] = f"not available: POST {running[name].path} answered {status}"
            del running[name]
            continue
        cosine = worst_cosine(got, want[: len(got)])
        if cosine < 0.99:  # INT8 keeps >= 0.99 (its export checks it); FP32 rows agree to 1e-5
            raise RuntimeError(f"{name} answered embeddings of worst cosine {cosine:.5f} with the floor's")
    return running


def inprocess_round(
    inprocess: dict[str, Callable[[Sequence[str]], np.ndarray]],
    groups: list[list[str]],
    plan: EmbeddingsPlan,
    round_: int,
    runs: dict[str, list[dict[str, Any]]],
    log: Callable[[str], None],
) -> None:
    for embed_name, embed in inprocess.items():
        rows = runs.setdefault(embed_name, [])
        rows.append({"sentences_per_s": rate(embed, groups, plan.inprocess_s)})
        log(f"embeddings round {round_ + 1} {embed_name:40} {rows[-1]['sentences_per_s']:8.1f} sent/s")


def http_round(
    running: dict[str, Running],
    groups: list[list[str]],
    plan: EmbeddingsPlan,
    round_: int,
    runs: dict[str, list[dict[str, Any]]],
    log: Callable[[str], None],
) -> None:
    """One cell per server, the order rotated each round so that no server always goes first."""
    order = list(running)
    order = order[round_ % max(1, len(order)) :] + order[: round_ % max(1, len(order))]
    for name in order:
        row = cell(running[name], groups, plan)
        runs.setdefault(name, []).append(row)
        log(f"embeddings round {round_ + 1} {name:40} {row['sentences_per_s']:8.1f} sent/s")


def _median(name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"row": name, "runs": [r["sentences_per_s"] for r in rows]}
    for key in rows[0]:
        values = [r[key] for r in rows]
        row[key] = sum(values) if key in ("errors", "requests") else statistics.median(values)
    return row
