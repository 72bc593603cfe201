"""Length groups under a token budget, and the TextBatcher pooling concurrent requests of a tiny exported BERT: each
text's answer equals that text run alone (1e-5), whatever it was grouped with."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from app.core.textbatching import TextBatcher, length_groups, stack
from app.core.textencoder import TextEncoderModel

pytest.importorskip("torch")


@pytest.mark.parametrize(
    ("lengths", "budget", "groups"),
    [
        ([5, 3, 9, 3], 100, [[1, 3, 0, 2]]),  # all fit: shortest first, ties in order
        ([5, 3, 9, 3], 10, [[1, 3], [0], [2]]),  # 3 x 3 = 9 fits, 3 x 5 does not; 2 x 9 > 10
        ([4, 4, 4, 4], 8, [[0, 1], [2, 3]]),
        ([30, 2], 10, [[1], [0]]),  # past the budget: alone
        ([], 10, []),
    ],
)
def test_length_groups_pad_each_group_to_its_longest_within_the_budget(
    lengths: list[int], budget: int, groups: list[list[int]]
) -> None:
    assert length_groups(lengths, budget) == groups


@pytest.fixture(scope="module")
def model(tiny_bert: TextEncoderModel) -> TextEncoderModel:
    return tiny_bert


TEXTS = ["a b", "Café naïve façade, déjà vu!", "東京は日本の首都です。", " ".join(["long words"] * 20), "Emoji 🙂"]


def test_stack_pads_rows_of_several_batches_to_their_own_longest(model: TextEncoderModel) -> None:
    one, two = model.tokenize(TEXTS[:2]), model.tokenize(TEXTS[2:])
    stacked = stack([(two, 1), (one, 0)], model.config.pad_token_id)
    alone = [model.tokenize([TEXTS[3]]), model.tokenize([TEXTS[0]])]
    assert stacked.input_ids.shape == (2, alone[0].input_ids.shape[1])
    for j, a in enumerate(alone):
        n = a.input_ids.shape[1]
        np.testing.assert_array_equal(stacked.input_ids[j, :n], a.input_ids[0])
        assert (stacked.input_ids[j, n:] == model.config.pad_token_id).all()
        assert stacked.attention_mask[j].sum() == n
        assert stacked.token_type_ids is not None and a.token_type_ids is not None


@pytest.mark.parametrize("budget", [16, 48, 1000])
def test_pooled_requests_each_answer_as_their_texts_alone(model: TextEncoderModel, budget: int) -> None:
    """Five requests queued together (in flight 5) are pooled and grouped; each text equals itself alone."""
    batcher = TextBatcher(model, budget, delay_us=200_000, in_flight=lambda: len(TEXTS))
    alone = [model.infer(model.tokenize([t])) for t in TEXTS]
    results: dict[int, tuple[np.ndarray, list[list[tuple[str, np.ndarray, np.ndarray]]]]] = {}

    def ask(i: int) -> None:
        results[i] = batcher.run(model.tokenize([TEXTS[i], TEXTS[(i + 3) % len(TEXTS)]]))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(TEXTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i, (embeddings, stats) in results.items():
        for row, k in enumerate((i, (i + 3) % len(TEXTS))):
            np.testing.assert_allclose(embeddings[row], alone[k].sentence_embedding[0], rtol=0, atol=1e-5)
            for (name, mean, std), (want, m, s) in zip(stats[row], alone[k].layer_norms, strict=True):
                assert name == want
                np.testing.assert_allclose(mean, m[0], rtol=0, atol=1e-5)
                np.testing.assert_allclose(std, s[0], rtol=0, atol=1e-5)
    assert sorted(results) == list(range(len(TEXTS)))
