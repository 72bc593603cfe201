"""The embeddings section's in-process rows: the floor (plain torch.onnx.export, one onnxruntime thread, the fast
tokenizer, mean pooling in NumPy) and normserve's text-encoder model kind, timed in this process."""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


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
