"""app/export/textgraph.py: the graph's head against sentence-transformers' own Pooling and Normalize modules."""

from __future__ import annotations

import pytest
import torch

from app.export.textgraph import pool
from app.export.textsource import Head

st_modules = pytest.importorskip("sentence_transformers.sentence_transformer.modules")


@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_pooling_and_normalization_are_sentence_transformers(pooling: str, normalize: bool) -> None:
    torch.manual_seed(0)
    hidden = 3.0 * torch.randn(3, 7, 16)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] + [0] * 6])  # full, padded, one token
    modules = [st_modules.Pooling(16, pooling_mode=pooling), *([st_modules.Normalize()] if normalize else [])]
    features = {"token_embeddings": hidden, "attention_mask": mask}
    for module in modules:
        features = module(features)
    got = pool(hidden, mask, Head(pooling, normalize, 7))
    torch.testing.assert_close(got, features["sentence_embedding"], rtol=0, atol=1e-6)
