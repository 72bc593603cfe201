"""A text encoder's tokenizer.json, opened as served: the `tokenizers` library alone (no transformers, no torch),
truncation and padding set here whatever the file says (cut at the manifest's max_seq_length, as
sentence-transformers cuts; padded to the longest text of a batch)."""

from __future__ import annotations

from pathlib import Path

import tokenizers

from app.core.model import Loaded, ModelLoadError
from app.core.textreference import TextConfig

TOKENIZER_FILE = "tokenizer.json"


def load_tokenizer(loaded: Loaded, config: TextConfig) -> tokenizers.Tokenizer:
    """tokenizer.json, which must be listed in the manifest's files (so that its sha256 was checked)."""
    path: Path = loaded.path.parent / TOKENIZER_FILE
    if TOKENIZER_FILE not in loaded.entry.get("files", {}):
        raise ModelLoadError(f"{path}: not listed in the manifest's files, so its sha256 cannot be checked")
    try:
        return open_tokenizer(path, config)
    except ValueError as e:
        raise ModelLoadError(f"{path}: {e}") from None


def open_tokenizer(path: Path, config: TextConfig) -> tokenizers.Tokenizer:
    """The tokenizer as served (and checked at export): truncating at max_seq_length, padding with the model's
    pad token to the longest text of a batch. ValueError if the file is not one, or disagrees with the config."""
    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises its own Exception subclass for any file it cannot read
        raise ValueError(f"the tokenizers library cannot read it ({e})") from None
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > config.vocab_size:
        raise ValueError(f"{size} tokens; the model's config.vocab_size is {config.vocab_size}")
    pad = tokenizer.id_to_token(config.pad_token_id)
    if pad is None:
        raise ValueError(f"no token of config.pad_token_id {config.pad_token_id}")
    tokenizer.enable_truncation(max_length=config.max_seq_length)
    tokenizer.enable_padding(pad_id=config.pad_token_id, pad_token=pad)
    return tokenizer
