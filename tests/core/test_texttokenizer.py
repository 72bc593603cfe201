"""texttokenizer.py: tokenizer.json opened as served (the `tokenizers` library, a real file): cut at
max_seq_length, padded with the config's pad token to the longest text; a file that disagrees with the config is
refused with a whole message."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.textreference import TextConfig
from app.core.texttokenizer import open_tokenizer

tokenizers = pytest.importorskip("tokenizers")

VOCAB = {"[PAD]": 0, "[UNK]": 1, "a": 2, "b": 3, "c": 4}


def _config(vocab_size: int = 8, pad_token_id: int = 0, max_seq_length: int = 3) -> TextConfig:
    sizes = {"hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 8}
    return TextConfig(
        model_type="bert",
        vocab_size=vocab_size,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        max_position_embeddings=16,
        type_vocab_size=2,
        pad_token_id=pad_token_id,
        position_offset=0,
        max_seq_length=max_seq_length,
        **sizes,
    )


@pytest.fixture
def tokenizer_json(tmp_path: Path) -> Path:
    """A word-level tokenizer.json, no truncation or padding of its own (the server sets them)."""
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.mark.parametrize(
    ("texts", "ids", "mask"),
    [
        (["a b", "c"], [[2, 3], [4, 0]], [[1, 1], [1, 0]]),
        (["a b c a b", "z"], [[2, 3, 4], [1, 0, 0]], [[1, 1, 1], [1, 0, 0]]),
    ],
    ids=["padded to the longest", "cut at max_seq_length"],
)
def test_texts_are_cut_at_max_seq_length_and_padded_to_the_longest(
    tokenizer_json: Path, texts: list[str], ids: list[list[int]], mask: list[list[int]]
) -> None:
    encodings = open_tokenizer(tokenizer_json, _config()).encode_batch(texts)
    assert [e.ids for e in encodings] == ids
    assert [e.attention_mask for e in encodings] == mask


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (_config(vocab_size=4), "5 tokens; the model's config.vocab_size is 4"),
        (_config(pad_token_id=7), "no token of config.pad_token_id 7"),
    ],
    ids=["vocabulary larger than the model's", "no pad token"],
)
def test_a_tokenizer_that_disagrees_with_the_config_is_refused(
    tokenizer_json: Path, config: TextConfig, message: str
) -> None:
    with pytest.raises(ValueError) as e:
        open_tokenizer(tokenizer_json, config)
    assert str(e.value) == message


def test_a_file_that_is_not_a_tokenizer_is_refused_naming_the_library(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text('{"not": "a tokenizer"}')
    with pytest.raises(ValueError, match=r"^the tokenizers library cannot read it \(.+\)$"):
        open_tokenizer(path, _config())
