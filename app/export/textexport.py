"""`normserve export text-encoder`: a Hugging Face BERT-family folder as the next version of a text encoder.

The folder is refused by name before anything is loaded when normserve cannot serve it (textsource.py). Otherwise
the version is staged whole (versions.py): model.onnx, weights.npz (what the NumPy reference reads), the tokenizer
files, and the manifest with the parity figures and the drift monitor's baseline (measured on `--calibration`'s
texts, else the parity texts); it lands only when the tokens equal the model's own tokenizer's and every parity
holds.
"""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from app.core.repository import MODEL_FILE, WEIGHTS_FILE
from app.core.textencoder import TextInput
from app.core.textreference import TextConfig
from app.export import baselines, builds, graph, textfusion, textgraph, textparity, textquantize, textsource, versions
from app.export.builds import ParityError
from app.export.exporter import Exported, check_opset, commit_version, writing

Progress = Callable[[str], None]
DEFAULT_TOLERANCE = 2e-5  # max abs of the embeddings against the user's model (API.md section 12)
# Calibration texts per run of the graph: a run is padded to its longest text, so this bounds its memory as the
# server's token budget does (16 texts of 256 tokens of all-MiniLM-L6-v2: ~56 KiB per token, ~0.23 GB at the peak).
CALIBRATION_BATCH = 16


def export_text_encoder(
    repository: Path,
    name: str,
    hf: Path,
    *,
    max_seq_length: int | None = None,
    pooling: str | None = None,
    normalize: bool | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    check_texts: Path | None = None,
    calibration: Path | None = None,
    version: int | None = None,
    opset: int = 18,
    quantize: str | None = None,
    optimize: bool = False,
    progress: Progress | None = None,
) -> Exported:
    """hf as version `version` of name (the next by default), flags over its head: --optimize fused if it keeps parity
    (textfusion.py), --quantize INT8 of the plain graph (textquantize.py); nothing lands unless every check holds."""
    say = progress or (lambda _message: None)
    source, head, config = _read(Path(hf), pooling, normalize, max_seq_length, opset)
    batch, calibrating = _texts(head, check_texts, calibration)
    started = time.perf_counter()
    model, wrapper = _loaded(source, head, config, say)
    with writing(Path(repository), say), versions.staging(Path(repository), name) as folder:
        say(f"exporting {name} (text-encoder, opset {opset}) ...")
        plain, *signature = textgraph.to_onnx(wrapper, config, opset)
        fused, fusion = _fused(plain, config, optimize and quantize is None, say)
        weights = _write_weights_and_tokenizer(folder, model, source)
        tokens, checked = _served_tokens_checked(folder, source, batch, config, head)
        check = functools.partial(_parity, name, source, head, batch, tokens, wrapper=wrapper, weights=weights)
        check = functools.partial(check, config=config, tolerance=tolerance, say=say)
        written, session, parity, fusion = _checked_graph(folder, name, (plain, fused), signature, (fusion, check), say)
        manifest = _manifest(written, source, head, wrapper.names) | {"fusion": fusion, "parity": parity | checked}
        if quantize is not None:  # after every FP32 parity: what is quantized is the checked graph
            manifest["quantization"], session = _quantized(folder, session, tokens, name, quantize, say)
        manifest["baseline"] = _baseline(folder, session, wrapper.names, (config, head), tokens, calibrating)
        manifest["source"] = {"class": type(model).__name__, "sentence_transformers": source.sentence_transformers}
        say(f"exported and checked {name} in {time.perf_counter() - started:.1f} s")
        return commit_version(Path(repository), name, folder, manifest, version)


def _manifest(
    written: dict[str, Any], source: textsource.TextSource, head: textsource.Head, layer_norms: list[str]
) -> dict[str, Any]:
    """The manifest's entries of the written file, the provenance, the folder's config, the head, the LayerNorms."""
    manifest = {"kind": "text-encoder", **written, **builds.provenance(), "config": source.config}
    return manifest | {**textsource.manifest_head(head), "layer_norms": layer_norms}


def _checked_graph(
    folder: Path,
    name: str,
    graphs: tuple[onnx.ModelProto, onnx.ModelProto],
    signature: list[Any],
    checking: tuple[dict[str, Any], Callable[[ort.InferenceSession], dict[str, Any]]],
    say: Progress,
) -> tuple[dict[str, Any], ort.InferenceSession, dict[str, Any], dict[str, Any]]:
    """The graph written and checked: the fused one first when there is one, the plain one if it misses parity.
    (manifest entries of the file, its session, its parity figures, the manifest's fusion record)."""
    (plain, fused), (fusion, check) = graphs, checking
    written = graph.write_onnx(folder, fused)
    session = graph.load_session(folder / MODEL_FILE, *signature)
    try:
        return written, session, check(session), fusion
    except ParityError as e:
        if fused is plain:
            raise
        say(f"the fused graph of {name} misses parity; checking the plain graph ({e})")
        written = graph.write_onnx(folder, plain)
        session = graph.load_session(folder / MODEL_FILE, *signature)
        return written, session, check(session), _refused(fusion, str(e))


def _read(
    hf: Path, pooling: str | None, normalize: bool | None, max_seq_length: int | None, opset: int
) -> tuple[textsource.TextSource, textsource.Head, TextConfig]:
    """The folder read and checked, its head with the user's overrides, the architecture the reference reads."""
    check_opset(opset)
    source = textsource.read(hf)
    head = textsource.chosen_head(source, pooling, normalize, max_seq_length)
    return source, head, textsource.text_config(source, head)


def _loaded(
    source: textsource.TextSource, head: textsource.Head, config: TextConfig, say: Progress
) -> tuple[Any, textgraph.TextEncoderGraph]:
    """The HF model, in torch, and the graph that wraps it with the head (pooling, normalization, statistics)."""
    say(f"loading {source.path} ({source.model_type}, {head.pooling} pooling, max {head.max_seq_length} tokens) ...")
    model = textgraph.load_model(source.path)
    return model, textgraph.TextEncoderGraph(model, head, config.has_token_types)


def _texts(
    head: textsource.Head, check_texts: Path | None, calibration: Path | None
) -> tuple[list[str], tuple[str, list[str]] | None]:
    """The parity texts, and --calibration's with how the manifest describes them: read before anything is written."""
    batch = textparity.texts(head.max_seq_length, check_texts)
    if calibration is None:
        return batch, None
    texts = textparity.read_texts(Path(calibration), "--calibration")
    return batch, (f"--calibration {Path(calibration).name} ({len(texts)} texts), at real tokens", texts)


def _baseline(
    folder: Path,
    session: ort.InferenceSession,
    layer_norms: list[str],
    served: tuple[TextConfig, textsource.Head],
    parity_tokens: TextInput,
    calibrating: tuple[str, list[str]] | None,
) -> dict[str, Any]:
    """The drift monitor's baseline: each LayerNorm's statistics as the served graph gives them on the calibration
    texts, tokenized as served, CALIBRATION_BATCH at a time; else on the parity texts."""
    if calibrating is None:
        described, batches = "the parity texts, at real tokens", iter([parity_tokens])
    else:
        described, texts = calibrating
        starts = range(0, len(texts), CALIBRATION_BATCH)
        batches = (textparity.served_tokens(folder, texts[i : i + CALIBRATION_BATCH], *served)[0] for i in starts)
    answers = ((textparity.run(session, tokens), tokens.attention_mask) for tokens in batches)
    return baselines.manifest_entry(baselines.text_stats(answers, layer_norms), described)


def _refused(fusion: dict[str, Any], why: str) -> dict[str, Any]:
    """The manifest's fusion record of a fused graph that missed parity: the plain graph was written instead."""
    return {**fusion, "fused": False, "refused": why}


def _fused(
    plain: onnx.ModelProto, config: TextConfig, optimize: bool, say: Progress
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """The graph to check first: the fused one (optimize), or the plain one; the manifest's "fusion" record."""
    if not optimize:
        return plain, {"fused": False}
    try:
        fused, counts = textfusion.fuse(plain, config)
    except Exception as e:  # the optimizer matches patterns of its own: a model it fails on is served plain
        say(f"not fused: onnxruntime's optimizer failed ({type(e).__name__}: {e}); the plain graph is checked")
        return plain, {"fused": False, "refused": f"{type(e).__name__}: {e}"}
    say(f"fused: {', '.join(f'{n} {op}' for op, n in counts.items() if n)} (onnxruntime.transformers.optimizer)")
    return fused, {"fused": True, "method": "onnxruntime.transformers.optimizer", "operators": counts}


def _quantized(
    folder: Path, session: ort.InferenceSession, tokens: TextInput, name: str, quantize: str, say: Progress
) -> tuple[dict[str, Any], ort.InferenceSession]:
    """The checked FP32 graph replaced by its quantization (textquantize.py): its figures for the manifest, and a
    session of the graph as served."""
    fp32 = textparity.run(session, tokens)["sentence_embedding"]
    figures = textquantize.quantize(folder, tokens, fp32, name)
    say(f"quantized {name} to {quantize}: worst cosine {figures['worst_cosine_vs_fp32']:.5f}")
    return figures, ort.InferenceSession(str(folder / MODEL_FILE), providers=["CPUExecutionProvider"])


def _write_weights_and_tokenizer(folder: Path, model: Any, source: textsource.TextSource) -> dict[str, np.ndarray]:
    """The files the version serves with beside its graph: the base model's weights, and the folder's tokenizer
    files, which the server tokenizes with. Returns the weights (parity compares the reference on them)."""
    weights = textgraph.weights(model)
    graph.save_npz(folder / WEIGHTS_FILE, weights)
    for file in textsource.TOKENIZER_FILES:
        if (source.path / file).is_file():
            shutil.copyfile(source.path / file, folder / file)
    return weights


def _served_tokens_checked(
    folder: Path, source: textsource.TextSource, batch: list[str], config: TextConfig, head: textsource.Head
) -> tuple[TextInput, dict[str, Any]]:
    """The parity texts as the server will tokenize them, and their check against the folder's own tokenizer (the
    manifest's parity entry "tokenizer")."""
    tokens, truncated = textparity.served_tokens(folder, batch, config, head)
    return tokens, {"tokenizer": textparity.check_tokens(source.path, batch, tokens, head, truncated)}


def _parity(
    name: str,
    source: textsource.TextSource,
    head: textsource.Head,
    batch: list[str],
    tokens: TextInput,
    session: ort.InferenceSession,
    *,
    wrapper: textgraph.TextEncoderGraph,
    weights: dict[str, np.ndarray],
    config: TextConfig,
    tolerance: float,
    say: Progress,
) -> dict[str, Any]:
    """Each comparison measured, said and recorded; ParityError naming the first that fails its bound."""
    out = textparity.run(session, tokens)
    st = None
    if source.sentence_transformers and head == source.head:  # flags that change the head change the model
        st = textparity.vs_sentence_transformers(source.path, batch, out, head)
    compared = {
        "onnx_vs_torch": (textparity.vs_torch(out, wrapper, tokens, head), tolerance),
        "onnx_vs_sentence_transformers": (st, tolerance),
        "onnx_vs_reference": (textparity.vs_reference(out, weights, config, tokens), textparity.REFERENCE_ATOL),
    }
    for what, (got, bound) in compared.items():
        if got is None:
            continue
        figures = f"{what}: worst cosine 1 - {1 - got['cosine']:.1e}, max abs {got['max_abs']:.2e}"
        say(f"parity {name}: {figures} (at most {bound:.0e})")
        if not (got["cosine"] >= textparity.COSINE_MIN and got["max_abs"] <= bound):  # NaN fails too
            raise ParityError(
                f"parity failed for {name}: {figures} (bounds: cosine at least {textparity.COSINE_MIN}, max abs at "
                f"most {bound:.0e}) on {len(batch)} texts; nothing written"
            )
    return {what: got for what, (got, _) in compared.items()} | {
        "cosine_min": textparity.COSINE_MIN,
        "tolerance": tolerance,
        "reference_tolerance": textparity.REFERENCE_ATOL,
    }
