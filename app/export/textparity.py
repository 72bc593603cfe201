"""A text encoder's parity at export: the served tokens against the model's own tokenizer, and the graph's answers
against the PyTorch model, sentence-transformers' encode and the float64 NumPy reference, on texts of several
languages and lengths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from app.core import textencoder, textreference, texttokenizer
from app.core.textencoder import TextInput
from app.core.textreference import TextConfig
from app.export.graph import ExportError
from app.export.textgraph import TextEncoderGraph, pool
from app.export.textsource import TOKENIZER, Head

COSINE_MIN = 0.99999  # every embedding against the user's model (API.md section 12)
REFERENCE_ATOL = 1e-5  # the graph's embeddings against the float64 NumPy reference
MEDIUM = (
    "Layer normalization rescales each token's features to zero mean and unit variance before the learned gain "
    "and bias, which keeps deep Transformer encoders stable while they train on large and varied collections of text."
)
BUILT_IN = (
    "a",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "Größere Äpfel schmecken süßer, sagte die Verkäuferin auf dem Wochenmarkt.",  # German
    "L'été dernier, nous sommes allés à la plage près de Nice avec nos élèves.",  # French
    "今天天气很好，我们去公园散步吧。",  # noqa: RUF001 - Chinese, its own full-width comma
    "東京は日本の首都で、とても大きな都市です。",  # Japanese
    "Москва — столица России и крупнейший город страны.",  # Russian
    "اللغة العربية جميلة جدا ويتحدث بها الملايين.",  # Arabic
    "I love pizza 🍕 and coffee ☕️ 😊👍🏽",  # emoji, a variation selector and a skin tone
    "Crème brûlée, naïve café, São Paulo, Ångström, résumé, Łódź.",  # accents
    MEDIUM,
)


class TokenizerMismatch(ExportError):
    """tokenizer.json, as the server runs it, gives other ids than the model's own tokenizer."""


def texts(max_seq_length: int, check_texts: Path | None) -> list[str]:
    """The built-in texts, one longer than the maximum length (a word is at least one token), and the user's."""
    words = MEDIUM.split()
    longer = " ".join(words[i % len(words)] for i in range(max_seq_length + 1))
    own = [] if check_texts is None else read_texts(Path(check_texts), "--check-texts")
    return [*BUILT_IN, longer, *own]


def read_texts(path: Path, flag: str) -> list[str]:
    """A UTF-8 file's texts, one a line, blank lines skipped; ValueError naming flag and path when there are none,
    the file cannot be read or is not UTF-8 (before anything is written)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot be read ({e.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{flag} {path}: not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    own = [line for line in text.splitlines() if line.strip()]
    if not own:
        raise ValueError(f"{flag} {path}: no text in it; expected one text a line")
    return own


def served_tokens(folder: Path, batch: Sequence[str], config: TextConfig, head: Head) -> tuple[TextInput, list[int]]:
    """The texts tokenized from the version's tokenizer.json by the server's own code; and those it cut short."""
    tok = texttokenizer.open_tokenizer(folder / TOKENIZER, config)
    return textencoder.encode_texts(tok, batch, config, head.do_lower_case)


def check_tokens(
    folder: Path, batch: Sequence[str], tokens: TextInput, head: Head, truncated: list[int]
) -> dict[str, Any]:
    """The ids, mask (and token types) equal to transformers' AutoTokenizer on the folder; TokenizerMismatch if not."""
    import transformers

    own = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    lowered = [text.lower() if head.do_lower_case else text for text in batch]
    token_types = tokens.token_type_ids is not None
    want = own(
        lowered,
        padding=True,
        truncation=True,
        max_length=head.max_seq_length,
        return_token_type_ids=token_types,
        return_tensors="np",
    )
    fields = ("input_ids", "attention_mask") + (("token_type_ids",) if token_types else ())
    for field in fields:
        got, expected = getattr(tokens, field), np.asarray(want[field], dtype=np.int64)
        rows = [i for i in range(len(batch)) if got.shape != expected.shape or not np.array_equal(got[i], expected[i])]
        if rows:
            i = rows[0]
            raise TokenizerMismatch(
                f"{folder / TOKENIZER} gives other {field} than the model's own tokenizer "
                f"({type(own).__name__}) for text {i} {batch[i][:60]!r}: {got[i].tolist()} != "
                f"{expected[i].tolist()}; nothing written"
            )
    return {"texts": len(batch), "truncated": len(truncated), "checked": list(fields)}


def figures(got: np.ndarray, want: np.ndarray) -> dict[str, float]:
    """Worst cosine similarity and max abs difference of two (B,C) batches of embeddings."""
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    norms = np.linalg.norm(got64, axis=1) * np.linalg.norm(want64, axis=1)
    cosine = (got64 * want64).sum(axis=1) / np.maximum(norms, 1e-300)
    return {"cosine": float(np.min(cosine)), "max_abs": float(np.max(np.abs(got64 - want64)))}


def at_tokens(got: np.ndarray, want: np.ndarray, mask: np.ndarray) -> float:
    """Max abs difference at real tokens only: what padded positions hold is no answer of the model."""
    real = mask.astype(bool)
    return float(np.max(np.abs(got.astype(np.float64)[real] - want.astype(np.float64)[real])))


def run(session: ort.InferenceSession, tokens: TextInput) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, tokens.feeds()), strict=True))


def vs_torch(
    onnx_out: Mapping[str, np.ndarray], wrapper: TextEncoderGraph, tokens: TextInput, head: Head
) -> dict[str, float]:
    """The graph against the user's HF model itself (with its 2-D mask) and the folder's pooling, in PyTorch."""
    feeds = {key: torch.from_numpy(value) for key, value in tokens.feeds().items()}
    with torch.no_grad():
        hidden = wrapper.model(**feeds).last_hidden_state
        sentence = pool(hidden, feeds["attention_mask"], head).numpy()
        stats = wrapper(*feeds.values())[2:]
    mask = tokens.attention_mask
    return figures(onnx_out["sentence_embedding"], sentence) | {
        "last_hidden_state_max_abs": at_tokens(onnx_out["last_hidden_state"], hidden.numpy(), mask),
        "layer_norms_max_abs": max(
            at_tokens(onnx_out[name], s.numpy(), mask)
            for name, s in zip(textencoder.output_names(wrapper.names)[2:], stats, strict=True)
        ),
    }


def vs_sentence_transformers(
    folder: Path, batch: Sequence[str], onnx_out: Mapping[str, np.ndarray], head: Head
) -> dict[str, float]:
    """The graph against SentenceTransformer(folder).encode, which tokenizes, batches and pools in its own way."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    model.max_seq_length = head.max_seq_length
    encoded = model.encode(list(batch), batch_size=8, convert_to_numpy=True, show_progress_bar=False)
    return figures(onnx_out["sentence_embedding"], np.asarray(encoded))


def vs_reference(
    onnx_out: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray], config: TextConfig, tokens: TextInput
) -> dict[str, float]:
    """The graph against the float64 NumPy reference on the weights written beside it."""
    ref = textreference.encode(weights, config, tokens.input_ids, tokens.attention_mask, tokens.token_type_ids)
    mask = tokens.attention_mask
    stats = {f"{name}.{s}": pair[i] for name, pair in ref.layer_norms.items() for i, s in enumerate(textencoder.STATS)}
    return figures(onnx_out["sentence_embedding"], ref.sentence_embedding) | {
        "last_hidden_state_max_abs": at_tokens(onnx_out["last_hidden_state"], ref.last_hidden_state, mask),
        "layer_norms_max_abs": max(at_tokens(onnx_out[name], value, mask) for name, value in stats.items()),
    }
