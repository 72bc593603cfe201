"""Running a text encoder's texts in groups of similar length under a token budget.

A padded batch costs every text the longest text's length: one 256-token text among 255 short ones pads all of
them to 256, and attention's memory grows with batch x heads x seq x seq (256 texts of 256 tokens on
all-MiniLM-L6-v2: 12 x 256 x 256 x 4 bytes per text, 805 MB in one run). So texts are sorted by length and cut into
groups whose padded size (texts x longest) stays within NORMSERVE_TEXT_BATCH_TOKENS, each padded only to its own
longest text. A text's answer does not depend on its group: attention is within a text, padding is masked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.core.textencoder import TextEncoderModel, TextInput


def length_groups(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of the texts, shortest first, cut into groups of at most `budget` padded tokens (a text longer
    than the budget runs alone)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[i] <= budget:  # sorted: this text is the group's longest
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def subset(request: TextInput, rows: list[int]) -> TextInput:
    """These rows of a right-padded batch, padded only to their own longest."""
    index = np.asarray(rows)
    width = int(request.attention_mask[index].sum(axis=1).max())
    types = None if request.token_type_ids is None else request.token_type_ids[index, :width]
    return TextInput(
        request.input_ids[index, :width], request.attention_mask[index, :width], types, request.hidden_states
    )


@dataclass(frozen=True)
class TextResult:
    """Per text, in the request's order: its embedding, its token count, and each LayerNorm's (name, mean, std)
    over its own tokens when asked."""

    embeddings: np.ndarray  # B,C float32
    tokens: list[int]
    layer_norms: list[list[tuple[str, np.ndarray, np.ndarray]]] | None


class GroupedRun:
    """A text encoder run by length groups: what Worker.serve's Job calls (name, version, batcher, infer)."""

    batcher = None  # the groups are made here; the encoders' batcher merges float tensors of one length

    def __init__(self, model: TextEncoderModel, budget: int, layer_norms: bool = False) -> None:
        self.model = model
        self.name, self.version, self.kind = model.name, model.version, model.kind
        self.budget = budget
        self.layer_norms = layer_norms

    def infer(self, request: TextInput) -> TextResult:
        tokens = request.tokens
        width = self.model.config.hidden_size
        embeddings = np.empty((len(tokens), width), dtype=np.float32)
        stats: list[list[tuple[str, np.ndarray, np.ndarray]]] = [[] for _ in tokens]
        for rows in length_groups(tokens, self.budget):
            out = self.model.infer(subset(request, rows))
            embeddings[rows] = out.sentence_embedding
            if self.layer_norms:
                for j, i in enumerate(rows):
                    stats[i] = [(n, m[j, : tokens[i]], s[j, : tokens[i]]) for n, m, s in out.layer_norms]
        return TextResult(embeddings, tokens, stats if self.layer_norms else None)
