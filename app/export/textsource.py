"""A Hugging Face folder read as a text encoder: architecture, head, tokenizer; what normserve cannot serve is refused.

The folder is what `save_pretrained` or sentence-transformers write: config.json, the weights, tokenizer.json,
and for a sentence-transformers model modules.json, 1_Pooling/config.json and sentence_bert_config.json. Only
files are read here (no torch): every refusal happens before anything is loaded or staged.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.core.textreference import MODEL_TYPES, POOLINGS, TextConfig

CONFIG, TOKENIZER = "config.json", "tokenizer.json"
WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # pytorch_model.bin is loaded weights-only by transformers
TOKENIZER_FILES = (TOKENIZER, "tokenizer_config.json", "special_tokens_map.json")  # copied beside the graph
ST_MODULES = "modules.json"
ST_CONFIG = "sentence_bert_config.json"
ST_TRANSFORMER, ST_POOLING, ST_NORMALIZE = "Transformer", "Pooling", "Normalize"  # by class: the module paths moved
# sentence-transformers before 6 wrote one flag per mode; those normserve pools with, and the others by their names
LEGACY_POOLING = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max"}
DISTILBERT_EPS = 1e-12  # DistilBERT's LayerNorms hardcode it; its config has no layer_norm_eps


class UnsupportedModel(ValueError):
    """A folder normserve does not export as a text encoder; the message names what and why."""


@dataclasses.dataclass(frozen=True)
class Head:
    """What turns the last hidden state into the sentence's vector, and the tokenizer's settings."""

    pooling: str
    normalize: bool
    max_seq_length: int
    do_lower_case: bool = False  # sentence-transformers lower-cases the text before its tokenizer sees it


@dataclasses.dataclass(frozen=True)
class TextSource:
    """The folder, its architecture as the manifest records it, the head as read from the folder."""

    path: Path
    config: dict[str, Any]  # manifest["config"]
    head: Head  # from the folder: what sentence-transformers' encode would do
    sentence_transformers: bool  # modules.json present: parity against SentenceTransformer(path).encode

    @property
    def model_type(self) -> str:
        return str(self.config["model_type"])


def read(path: Path) -> TextSource:
    """The folder's architecture and head; UnsupportedModel naming what stands in the way."""
    path = Path(path)
    if not path.is_dir():
        raise UnsupportedModel(f"{path}: not a folder; --hf takes a local folder as save_pretrained writes it")
    if (path / "adapter_config.json").exists():
        raise UnsupportedModel(
            f"{path}: adapter_config.json: an adapter (PEFT) is not a whole model; merge it into its base model "
            "(merge_and_unload), save_pretrained that, and export the result"
        )
    if not (path / CONFIG).is_file():
        raise UnsupportedModel(f"{path}: no {CONFIG}; --hf takes a folder as save_pretrained writes it")
    hf = _json(path / CONFIG)
    remote = sorted(k for k in ("auto_map", "trust_remote_code") if k in hf)
    if remote:
        raise UnsupportedModel(
            f"{path / CONFIG}: {', '.join(remote)}: the model's code ships in the folder (trust_remote_code); "
            "normserve exports only transformers' own architectures and never runs code from a model folder"
        )
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise UnsupportedModel(
            f"{path / CONFIG}: model_type {model_type!r} is not supported; text encoders are one of "
            f"{', '.join(MODEL_TYPES)}"
        )
    if not (path / TOKENIZER).is_file():
        raise UnsupportedModel(
            f"{path}: no {TOKENIZER}; the server tokenizes with it (the `tokenizers` library): save the model's "
            "fast tokenizer into the folder (AutoTokenizer.from_pretrained(...).save_pretrained(folder))"
        )
    if not any((path / name).is_file() for name in WEIGHTS):
        raise UnsupportedModel(f"{path}: no weights; expected {' or '.join(WEIGHTS)}")
    config = architecture(hf)
    st = (path / ST_MODULES).is_file()
    return TextSource(path, config, _st_head(path, config) if st else _plain_head(config), st)


def architecture(hf: Mapping[str, Any]) -> dict[str, Any]:
    """manifest["config"] from config.json: DistilBERT's own field names mapped onto BERT's."""
    model_type = str(hf["model_type"])
    if model_type == "distilbert":
        sizes = {"hidden_size": "dim", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads"}
        sizes |= {"intermediate_size": "hidden_dim", "hidden_act": "activation"}
        fields = {key: hf[name] for key, name in sizes.items()}
        fields |= {"layer_norm_eps": DISTILBERT_EPS, "type_vocab_size": 0}
    else:
        names = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act")
        fields = {key: hf[key] for key in (*names, "layer_norm_eps", "type_vocab_size")}
    pad = int(hf.get("pad_token_id") or 0)
    return {
        "model_type": model_type,
        "vocab_size": hf["vocab_size"],
        **fields,
        "max_position_embeddings": hf["max_position_embeddings"],
        "pad_token_id": pad,
        # RoBERTa counts positions from padding_idx + 1 (create_position_ids_from_input_ids)
        "position_offset": pad + 1 if model_type in ("roberta", "xlm-roberta") else 0,
        # DistilBERT's sinusoidal table is written into position_embeddings.weight: the weights hold it either way
        "sinusoidal_pos_embds": bool(hf.get("sinusoidal_pos_embds", False)),
    }


def longest(config: Mapping[str, Any]) -> int:
    """The most tokens the position table allows: RoBERTa's first offset rows are not positions of tokens."""
    return int(config["max_position_embeddings"]) - int(config["position_offset"])


def _plain_head(config: Mapping[str, Any]) -> Head:
    """What sentence-transformers builds for a plain save_pretrained folder: mean pooling, no normalization."""
    return Head("mean", False, longest(config))


def _st_head(path: Path, config: Mapping[str, Any]) -> Head:
    modules = _json(path / ST_MODULES)
    if not isinstance(modules, list):
        raise UnsupportedModel(f"{path / ST_MODULES}: expected a list of modules")
    types = [_st_class(str(m.get("type"))) for m in modules]
    others = [
        f"{m.get('path') or m.get('name')} ({m.get('type')})"
        for m, t in zip(modules, types, strict=True)
        if t not in (ST_TRANSFORMER, ST_POOLING, ST_NORMALIZE)
    ]
    if others or not types or types[0] != ST_TRANSFORMER:
        raise UnsupportedModel(
            f"{path / ST_MODULES}: modules {', '.join(others) or types}; normserve exports a Transformer followed by "
            "Pooling and Normalize only"
        )
    pooling = "none"
    if ST_POOLING in types:
        folder = str(modules[types.index(ST_POOLING)].get("path", ""))
        pooling = _pooling(path / folder / "config.json")
    settings = _json(path / ST_CONFIG) if (path / ST_CONFIG).is_file() else {}
    return Head(
        pooling, ST_NORMALIZE in types, _st_max_length(path, settings, config), bool(settings.get("do_lower_case"))
    )


def _st_max_length(path: Path, settings: Mapping[str, Any], config: Mapping[str, Any]) -> int:
    """sentence_bert_config.json's max_seq_length, else the tokenizer's model_max_length (where sentence-transformers
    6 keeps it), within the position table."""
    tokenizer = _json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").is_file() else {}
    given = settings.get("max_seq_length") or tokenizer.get("model_max_length")
    if isinstance(given, int) and not isinstance(given, bool) and given > 0:
        return min(given, longest(config))
    return longest(config)


def _st_class(qualified: str) -> str:
    """Transformer, Pooling or Normalize for sentence-transformers' own modules (sentence_transformers.models.Pooling
    before 6.0, sentence_transformers.sentence_transformer.modules.pooling.Pooling since); else the whole name."""
    package, _, name = qualified.rpartition(".")
    return name if package.split(".")[0] == "sentence_transformers" else qualified


def _pooling(file: Path) -> str:
    """mean or cls from 1_Pooling/config.json ("pooling_mode" since sentence-transformers 6, a pooling_mode_* flag
    before); any other mode is refused by name."""
    doc = _json(file)
    modes = doc.get("pooling_mode")
    if modes is None:
        modes = [LEGACY_POOLING.get(k, k) for k, v in doc.items() if k.startswith("pooling_mode_") and v is True]
    chosen = [modes] if isinstance(modes, str) else list(modes)
    if len(chosen) != 1 or chosen[0] not in ("mean", "cls"):
        raise UnsupportedModel(
            f"{file}: pooling {', '.join(map(str, chosen)) or 'none chosen'}; normserve pools with exactly one of "
            "mean, cls"
        )
    return str(chosen[0])


def chosen_head(source: TextSource, pooling: str | None, normalize: bool | None, max_len: int | None) -> Head:
    """The folder's head with the flags' overrides; ValueError for a length past the position table."""
    head = source.head
    if pooling is not None and pooling not in POOLINGS:
        raise ValueError(f"--pooling {pooling!r}; expected one of {', '.join(POOLINGS)}")
    chosen = dataclasses.replace(
        head,
        pooling=head.pooling if pooling is None else pooling,
        normalize=head.normalize if normalize is None else normalize,
        max_seq_length=head.max_seq_length if max_len is None else max_len,
    )
    if not 1 <= chosen.max_seq_length <= longest(source.config):
        raise ValueError(
            f"--max-sequence-length {chosen.max_seq_length}: expected 1 to {longest(source.config)}, the positions "
            f"of {source.path / CONFIG}"
        )
    return chosen


def text_config(source: TextSource, head: Head) -> TextConfig:
    """The NumPy reference's config for this architecture and head."""
    manifest = {"config": source.config, **manifest_head(head)}
    return TextConfig.from_manifest(manifest)


def manifest_head(head: Head) -> dict[str, Any]:
    return {
        "pooling": head.pooling,
        "normalize": head.normalize,
        "max_seq_length": head.max_seq_length,
        "do_lower_case": head.do_lower_case,
    }


def _json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UnsupportedModel(f"{file}: not readable JSON ({e})") from e
