"""The text-encoder kind: a BERT-family model (app/core/textreference.py) and its tokenizer; text in, embeddings out.

The version folder holds the graph, the weights the NumPy reference reads, tokenizer.json and the manifest
(API.md section 12). The graph takes `input_ids`, `attention_mask` (and `token_type_ids` for BERT), int64
(B,T), and returns `sentence_embedding` (B,C, pooled and normalized in the graph), `last_hidden_state`
(B,T,C) and each LayerNorm's `{name}.mean` and `{name}.std` (B,T) in execution order.

Tokenizing needs the `tokenizers` library alone (the Rust tokenizer the models ship with): no transformers, no
torch. Its truncation and padding are set here, whatever tokenizer.json says: cut at the manifest's
max_seq_length, as sentence-transformers cuts, and padded to the longest text of the batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tokenizers

from app.core import heap, textreference
from app.core.dataplane import Fields, ModelInfo
from app.core.model import FLOAT, Loaded, Model, ModelLoadError, Signature, TensorSpec, read_weights
from app.core.repository import MANIFEST
from app.core.textreference import TextConfig
from app.core.texttokenizer import load_tokenizer
from app.errors import InvalidInput, shown

STATS = ("mean", "std")
# The reference and the graph agree on the sentence embedding within this (API.md section 12); on the hidden states
# and statistics within this times their magnitude, as float32 keeps ~7 digits of them (all-MiniLM-L6-v2: hidden
# states up to 6, within 2.3e-6 of the reference; LayerNorm input std up to 11, within 1.3e-5).
TEXT_ATOL = 1e-5
# The warm-up's texts: several scripts, accents, an emoji, and last one past any model's maximum length (truncated).
WARM_UP_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Café, naïve, façade: déjà vu.",
    "東京は日本の首都です。",
    "Emoji too 🙂",
    " ".join(["a long sentence that goes on"] * 120),
)


def token_inputs(config: TextConfig) -> list[str]:
    """The graph's inputs: token types for BERT alone (RoBERTa's single type is always 0)."""
    return ["input_ids", "attention_mask", *(["token_type_ids"] if config.has_token_types else [])]


def output_names(layer_norms: list[str]) -> list[str]:
    """`sentence_embedding`, `last_hidden_state`, then `{name}.mean` and `{name}.std` per LayerNorm in order."""
    return ["sentence_embedding", "last_hidden_state"] + [f"{n}.{s}" for n in layer_norms for s in STATS]


def signature(config: TextConfig) -> tuple[Signature, Signature]:
    """The graph's inputs and outputs; batch and seq are dynamic."""
    inputs: Signature = [(name, ["batch", "seq"]) for name in token_inputs(config)]
    c = config.hidden_size
    names = output_names(textreference.layer_norm_names(config))
    outputs: Signature = [(names[0], ["batch", c]), (names[1], ["batch", "seq", c])]
    return inputs, outputs + [(name, ["batch", "seq"]) for name in names[2:]]


@dataclass(frozen=True)
class TextInput:
    """A padded batch of token ids, int64 (B,T); token_type_ids only where the model takes them."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray | None = None
    hidden_states: bool = False  # whether the answer carries last_hidden_state

    @property
    def tokens(self) -> list[int]:
        """Each text's token count, special tokens included (the usage OpenAI's API reports)."""
        return [int(n) for n in self.attention_mask.sum(axis=1)]

    def feeds(self) -> dict[str, np.ndarray]:
        feeds = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        return feeds if self.token_type_ids is None else {**feeds, "token_type_ids": self.token_type_ids}


@dataclass(frozen=True)
class TextOutput:
    sentence_embedding: np.ndarray  # B,C float32
    layer_norms: list[tuple[str, np.ndarray, np.ndarray]]  # (name, mean B,T, std B,T) in execution order
    info: ModelInfo
    tokens: list[int] = field(default_factory=list)
    last_hidden_state: np.ndarray | None = None  # B,T,C when asked


class TextEncoderModel(Model):
    """V2 metadata: INT64 `input_ids`, `attention_mask` (and `token_type_ids`) [batch, seq]; outputs as the graph's."""

    kind = "text-encoder"

    def __init__(self, loaded: Loaded) -> None:
        super().__init__(loaded)
        entry, where = loaded.entry, loaded.path.parent / MANIFEST
        try:
            self.config = TextConfig.from_manifest(entry)
        except ValueError as e:
            raise ModelLoadError(f"{where}: {e}") from None
        self.layer_norms = textreference.layer_norm_names(self.config)
        if entry.get("layer_norms") != self.layer_norms:
            raise ModelLoadError(
                f"{where}: layer_norms {shown(entry.get('layer_norms'))}; a {self.config.model_type} model with this "
                f"config has {self.layer_norms}"
            )
        self.output_names = output_names(self.layer_norms)
        self.graph = signature(self.config)
        self.tokenizer = load_tokenizer(loaded, self.config)
        # sentence-transformers lower-cases the text itself when sentence_bert_config.json says so
        self.do_lower_case = entry.get("do_lower_case", False) is True
        self.inputs = tuple(TensorSpec(name, ("INT64",), (-1, -1)) for name in token_inputs(self.config))
        c = self.config.hidden_size
        self.outputs = (
            TensorSpec("sentence_embedding", FLOAT, (-1, c)),
            TensorSpec("last_hidden_state", FLOAT, (-1, -1, c)),
            *(TensorSpec(name, FLOAT, (-1, -1)) for name in self.output_names[2:]),
        )
        self._loaded = loaded  # the weights are read when the reference runs, not held for the version's life
        self.quantization: dict[str, Any] | None = entry.get("quantization")  # app/export/textquantize.py

    def weights(self) -> dict[str, np.ndarray]:
        """weights.npz, read afresh: only the warm-up and validation run the reference."""
        return read_weights(self._loaded, np.float32)

    def tokenize(self, texts: Sequence[Any], name: str = "input", truncate: bool = True) -> TextInput:
        """Texts as the model's own tokenizer makes them, cut at max_seq_length (or refused, truncate false)."""
        if isinstance(texts, str) or not isinstance(texts, Sequence) or not texts:
            raise InvalidInput(f"{shown(texts)}; expected a non-empty list of strings", name)
        for i, text in enumerate(texts):
            if not isinstance(text, str) or not text:
                raise InvalidInput(f"{shown(text)}; expected a non-empty string", f"{name}[{i}]")
        request, overflowing = encode_texts(self.tokenizer, texts, self.config, self.do_lower_case)
        if not truncate and overflowing:
            raise InvalidInput(
                f"longer than the model's maximum of {self.config.max_seq_length} tokens (truncate: true cuts it "
                "there)",
                f"{name}[{overflowing[0]}]",
            )
        return request

    def from_ids(self, ids: Sequence[Any], name: str = "input", flat: bool = False) -> TextInput:
        """Token ids given as lists of ints, one list per text: each checked, padded with the pad token.

        flat: ids is one text's list of ints, named as its sender sees it: `input[j]`, not `input[0][j]`."""
        if not flat and (isinstance(ids, str) or not isinstance(ids, Sequence) or not ids):
            raise InvalidInput(f"{shown(ids)}; expected a non-empty list of lists of token ids", name)
        named = [(ids, name)] if flat else [(row, f"{name}[{i}]") for i, row in enumerate(ids)]
        rows: list[tuple[list[int], str]] = []
        for row, row_name in named:
            if isinstance(row, str) or not isinstance(row, Sequence) or not row:
                raise InvalidInput(f"{shown(row)}; expected a non-empty list of token ids", row_name)
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in row):
                raise InvalidInput(f"{shown(row)}; expected integers", row_name)
            rows.append((list(row), row_name))
        longest = max(len(r) for r, _ in rows)
        padded = np.full((len(rows), longest), self.config.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(rows), longest), dtype=np.int64)
        for i, (row, row_name) in enumerate(rows):
            padded[i, : len(row)] = self._checked_ids(row, row_name)
            mask[i, : len(row)] = 1
        return TextInput(padded, mask, np.zeros_like(padded) if self.config.has_token_types else None)

    def _checked_ids(self, row: list[int], name: str) -> np.ndarray:
        """One text's ids: no more than max_seq_length, each in the vocabulary."""
        if len(row) > self.config.max_seq_length:
            raise InvalidInput(f"{len(row)} token ids; the model takes at most {self.config.max_seq_length}", name)
        bad = [(j, t) for j, t in enumerate(row) if not 0 <= t < self.config.vocab_size]
        if bad:
            j, t = bad[0]
            raise InvalidInput(
                f"token id {t} is outside the vocabulary; expected 0 <= id < {self.config.vocab_size}", f"{name}[{j}]"
            )
        return np.array(row, dtype=np.int64)

    def check_tensors(self, tensors: Mapping[str, np.ndarray], f: Fields) -> None:
        """Open Inference Protocol inference does not take text encoders yet: a 400 naming the kinds it takes (the
        codecs call this before anything reads the tensors)."""
        raise self.not_over_v2()

    def from_tensors(
        self, tensors: Mapping[str, np.ndarray], params: Mapping[str, Any], f: Fields, dtype: str = "FP32"
    ) -> TextInput:
        raise self.not_over_v2()

    def not_over_v2(self) -> InvalidInput:
        return InvalidInput(
            f"model {self.name!r} is of kind {self.kind}; inference over the Open Inference Protocol takes the "
            "kinds layernorm and encoder",
            "model",
        )

    def to_tensors(self, result: TextOutput) -> dict[str, np.ndarray]:
        tensors = {"sentence_embedding": result.sentence_embedding}
        if result.last_hidden_state is not None:
            tensors["last_hidden_state"] = result.last_hidden_state
        for name, mean, std in result.layer_norms:
            tensors[f"{name}.mean"], tensors[f"{name}.std"] = mean, std
        return tensors

    def infer(self, request: TextInput) -> TextOutput:
        """One run of the graph: the sentence embeddings, each LayerNorm's statistics, the hidden states if asked."""
        names = [n for n in self.output_names if request.hidden_states or n != "last_hidden_state"]
        outs = dict(zip(names, self.run(request.feeds(), names), strict=True))
        stats = [(n, outs[f"{n}.mean"], outs[f"{n}.std"]) for n in self.layer_norms]
        hidden = outs.get("last_hidden_state")
        return TextOutput(outs["sentence_embedding"], stats, self.info, request.tokens, hidden)

    def check(self, *batches: Sequence[str]) -> dict[str, tuple[float, float]]:
        """The graph against the float64 reference, each batch of texts padded on its own: the worst (max abs diff,
        tolerance) of the sentence embedding, and of the hidden states and LayerNorm statistics at real tokens, over
        the batches; each tolerance but the embedding's scaled by the magnitude of what it bounds."""
        weights = self.weights()
        pairs: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for texts in batches:
            request = dataclasses.replace(self.tokenize(texts), hidden_states=True)
            outs = dict(zip(self.output_names, self.run(request.feeds(), None, heap.shrinking_run()), strict=True))
            ref = textreference.encode(
                weights, self.config, request.input_ids, request.attention_mask, request.token_type_ids
            )
            # Real tokens only: a padding position's values mean nothing, and its float32 error is larger (6e-5
            # against 2e-6 on all-MiniLM-L6-v2's hidden states, texts padded to 256 tokens).
            real = request.attention_mask.astype(bool)  # B,T
            for what, got, want in (
                ("embedding", outs["sentence_embedding"], ref.sentence_embedding),
                ("hidden states", outs["last_hidden_state"][real], ref.last_hidden_state[real]),
                *(("LayerNorm mean", outs[f"{n}.mean"][real], ref.layer_norms[n][0][real]) for n in self.layer_norms),
                *(("LayerNorm std", outs[f"{n}.std"][real], ref.layer_norms[n][1][real]) for n in self.layer_norms),
            ):
                pairs.setdefault(what, []).append((got, want))
        figures = {}
        for what, arrays in pairs.items():
            diff = max(float(np.abs(got - want).max()) for got, want in arrays)
            scale = max(1.0, *(float(np.abs(want).max()) for _, want in arrays))
            figures[what] = (diff, TEXT_ATOL * (1.0 if what == "embedding" else scale))
        return figures

    def warm_up(self) -> tuple[float, float]:
        """The built-in texts, the longest alone (cut at max_seq_length, so the graph runs that long; the others
        not padded to it): the sentence embedding's figure, and a ModelLoadError if another is past its own."""
        if self.quantization is not None:
            return self.warm_up_quantized(float(self.quantization["cosine_min"]))
        figures = self.check(WARM_UP_TEXTS[:-1], WARM_UP_TEXTS[-1:])
        for what, (diff, atol) in figures.items():
            if not diff <= atol:
                raise ModelLoadError(f"{self.path}: parity warm-up failed, {what} max abs diff {diff:.3g} > {atol:.3g}")
        return figures["embedding"]

    def warm_up_quantized(self, cosine_min: float) -> tuple[float, float]:
        """An INT8 graph keeps the cosine its export checked, not float32's digits: each warm-up text's embedding
        against the float64 reference, (1 - the worst cosine, 1 - its bound)."""
        weights, worst = self.weights(), 1.0
        for texts in (WARM_UP_TEXTS[:-1], WARM_UP_TEXTS[-1:]):
            request = self.tokenize(texts)
            got = self.infer(request).sentence_embedding.astype(np.float64)
            ref = textreference.encode(
                weights, self.config, request.input_ids, request.attention_mask, request.token_type_ids
            ).sentence_embedding
            cos = (got * ref).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
            worst = min(worst, float(cos.min()))
        if not worst >= cosine_min:
            raise ModelLoadError(f"{self.path}: INT8 warm-up failed, worst cosine {worst:.5f} < {cosine_min}")
        return 1.0 - worst, 1.0 - cosine_min


def encode_texts(
    tokenizer: tokenizers.Tokenizer, texts: Sequence[str], config: TextConfig, do_lower_case: bool = False
) -> tuple[TextInput, list[int]]:
    """Texts as the model's own tokenizer makes them, int64 (B,T), and the indices of those it cut short."""
    encodings = tokenizer.encode_batch([t.lower() if do_lower_case else t for t in texts])
    ids = np.array([e.ids for e in encodings], dtype=np.int64)  # B,T
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)  # B,T
    types = np.array([e.type_ids for e in encodings], dtype=np.int64) if config.has_token_types else None  # B,T
    return TextInput(ids, mask, types), [i for i, e in enumerate(encodings) if e.overflowing]
