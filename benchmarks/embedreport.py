"""The embeddings section's report: the table of rows, the rows left out, and the issue's goals met or missed."""

from __future__ import annotations

from typing import Any

from benchmarks.embedrows import (
    FLOOR,
    GOAL_INT8,
    GOAL_SHORT,
    GOAL_VS_BEST,
    INFINITY,
    INPROCESS,
    INPROCESS_INT8,
    NORMSERVE,
    NORMSERVE_INT8,
    SHORT_TEXT,
    ST,
)

LABELS = {
    FLOOR: "the floor: torch.onnx.export, onnxruntime 1 thread, fast tokenizer, mean pooling, Python loop",
    INPROCESS: "normserve's text-encoder model kind, in process (tokenize + infer, no HTTP)",
    INPROCESS_INT8: "normserve's model kind, INT8 export, in process",
    ST: "sentence-transformers behind FastAPI (torch, 1 thread)",
    INFINITY: "Infinity 0.0.78 (infinity_emb v2, torch engine, CPU)",
    NORMSERVE: "normserve POST /v1/embeddings",
    NORMSERVE_INT8: "normserve POST /v1/embeddings, INT8 export",
}


def verdict(what: str, ratio: float | None, ok: bool | None, why: str = "") -> list[str]:
    """A goal's row: the measured ratio and met or missed, or not measured and why."""
    if ratio is None:
        return [what, "not measured", why or "-"]
    return [what, f"{ratio:.2f}x", "met" if ok else "**missed**"]


def goals(e: dict[str, Any]) -> list[list[str]]:
    """The issue's goals against the measured rows: met, missed, or not measured (and why)."""
    rate_of = {r["row"]: r["sentences_per_s"] for r in e["rows"]}
    short = e["short_p50_ms"]
    best = max((rate_of[n] for n in (FLOOR, ST, INFINITY) if n in rate_of), default=float("nan"))
    absent = e["skipped"].get(NORMSERVE, "not in this run")
    ours, lone = rate_of.get(NORMSERVE), short.get(NORMSERVE)
    out = [
        verdict(
            f"normserve /v1/embeddings >= {GOAL_VS_BEST:g}x the fastest of floor, sentence-transformers, Infinity",
            None if ours is None else ours / best,
            None if ours is None else ours / best >= GOAL_VS_BEST,
            absent,
        ),
        verdict(
            f"a short text alone, p50 <= {GOAL_SHORT:g}x the floor's time for it",
            None if lone is None else lone / short[FLOOR],
            None if lone is None else lone / short[FLOOR] <= GOAL_SHORT,
            absent,
        ),
    ]
    for fp32, int8 in ((NORMSERVE, NORMSERVE_INT8), (INPROCESS, INPROCESS_INT8)):
        a, b = rate_of.get(fp32), rate_of.get(int8)
        out.append(
            verdict(
                f"{LABELS[int8]} >= {GOAL_INT8:g}x its FP32 row",
                None if a is None or b is None else b / a,
                None if a is None or b is None else b / a >= GOAL_INT8,
                e["skipped"].get(int8, e["skipped"].get(fp32, "not in this run")),
            )
        )
    ratio = rate_of[INPROCESS] / rate_of[FLOOR]
    out.append([f"{LABELS[INPROCESS]} against the floor, in process", f"{ratio:.2f}x", "-"])
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
