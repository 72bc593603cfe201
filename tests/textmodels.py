"""Tiny random Hugging Face text encoders in a folder, as save_pretrained (or sentence-transformers) writes them.

Each architecture gets the tokenizer it ships with in practice, trained here on a few multilingual sentences with
the `tokenizers` library: BERT and DistilBERT a WordPiece vocabulary, RoBERTa a byte-level BPE, XLM-RoBERTa a
Unigram model. The weights are redrawn larger than transformers' initialization (std 0.02), with the LayerNorms'
gamma away from 1, so that attention is far from uniform and a wrong mask, position or pooling shows.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import (
    BertWordPieceTokenizer,
    ByteLevelBPETokenizer,
    SentencePieceUnigramTokenizer,
    Tokenizer,
    processors,
)

from app.export.textparity import BUILT_IN

MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert")
HIDDEN, LAYERS, HEADS, FFN, POSITIONS = 32, 2, 4, 37, 40
VOCAB = 300  # what the trainers aim at; WordPiece keeps every character of the corpus beside it
CORPUS = [*BUILT_IN, "Sentence embeddings compare texts by the cosine of their vectors.", "ünïcödé ÀÉÎÕÜ ßæøå"] * 3
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # pad 0, as in BERT's vocab
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # pad 1: RoBERTa's positions start at 2
ACTIVATIONS = {"bert": "gelu", "roberta": "gelu_new", "xlm-roberta": "relu", "distilbert": "gelu"}


@dataclasses.dataclass(frozen=True)
class TinyModel:
    path: Path
    model_type: str
    pad_token_id: int
    max_positions: int  # the tokens a text may have: max_position_embeddings less RoBERTa's offset


def _wordpiece() -> tuple[Tokenizer, dict[str, str]]:
    trainer = BertWordPieceTokenizer(lowercase=True, strip_accents=True)
    trainer.train_from_iterator(CORPUS, vocab_size=VOCAB, special_tokens=BERT_SPECIALS, show_progress=False)
    tok: Tokenizer = trainer._tokenizer
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", 2))
    specials = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
    return tok, specials | {"mask_token": "[MASK]"}


def _byte_level_bpe() -> tuple[Tokenizer, dict[str, str]]:
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(CORPUS, vocab_size=VOCAB, special_tokens=ROBERTA_SPECIALS, show_progress=False)
    tok: Tokenizer = trainer._tokenizer
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tok, _roberta_specials()


def _unigram() -> tuple[Tokenizer, dict[str, str]]:
    trainer = SentencePieceUnigramTokenizer()
    trainer.train_from_iterator(
        CORPUS, vocab_size=VOCAB, special_tokens=ROBERTA_SPECIALS, unk_token="<unk>", show_progress=False
    )
    tok: Tokenizer = trainer._tokenizer
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    return tok, _roberta_specials()


def _roberta_specials() -> dict[str, str]:
    return {"bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>", "pad_token": "<pad>"} | {
        "unk_token": "<unk>",
        "mask_token": "<mask>",
    }


TOKENIZERS = {"bert": _wordpiece, "distilbert": _wordpiece, "roberta": _byte_level_bpe, "xlm-roberta": _unigram}


def _model(model_type: str, vocab_size: int, pad: int, hidden_act: str) -> Any:
    common: dict[str, Any] = {"vocab_size": vocab_size, "max_position_embeddings": POSITIONS, "pad_token_id": pad}
    if model_type == "distilbert":
        config = transformers.DistilBertConfig(
            dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FFN, activation=hidden_act, **common
        )
        return transformers.DistilBertModel(config)
    classes = {
        "bert": (transformers.BertConfig, transformers.BertModel),
        "roberta": (transformers.RobertaConfig, transformers.RobertaModel),
        "xlm-roberta": (transformers.XLMRobertaConfig, transformers.XLMRobertaModel),
    }
    config_class, model_class = classes[model_type]
    hf = config_class(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        hidden_act=hidden_act,
        type_vocab_size=2 if model_type == "bert" else 1,
        **common,
    )
    return model_class(hf)


def tiny_model(
    folder: Path, model_type: str, *, seed: int = 0, safetensors: bool = True, hidden_act: str | None = None
) -> TinyModel:
    """A random model of model_type with its trained tokenizer, saved with save_pretrained into folder.

    hidden_act: default ACTIVATIONS[model_type]; safetensors=False writes pytorch_model.bin instead.
    """
    tok, specials = TOKENIZERS[model_type]()
    pad = tok.token_to_id(specials["pad_token"])
    torch.manual_seed(seed)
    model = _model(model_type, tok.get_vocab_size(), pad, hidden_act or ACTIVATIONS[model_type])
    with torch.no_grad():
        for name, p in model.named_parameters():
            centre = 1.0 if name.endswith(("LayerNorm.weight", "layer_norm.weight")) else 0.0
            p.copy_(centre + 0.3 * torch.randn_like(p))
    model.save_pretrained(folder)
    if not safetensors:  # transformers 5 writes safetensors only: the older format as torch.save wrote it
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
    max_positions = POSITIONS - (pad + 1 if model_type in ("roberta", "xlm-roberta") else 0)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=max_positions, **specials)
    fast.save_pretrained(folder)
    return TinyModel(folder, model_type, pad, max_positions)


def sentence_transformers_folder(tiny: TinyModel, folder: Path, pooling: str, normalize: bool, max_len: int) -> Path:
    """tiny as a sentence-transformers model: Transformer, Pooling and optionally Normalize, saved into folder."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    modules = [Transformer(str(tiny.path), max_seq_length=max_len), Pooling(HIDDEN, pooling_mode=pooling)]
    model = SentenceTransformer(modules=[*modules, Normalize()] if normalize else modules, device="cpu")
    model.save(str(folder))
    return folder
