"""Length groups under a token budget, and the TextBatcher pooling concurrent requests of a tiny exported BERT: each
text's answer equals that text run alone (1e-5), whatever it was grouped with."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from app.core.dataplane import Fields
from app.core.textbatching import Pooled, Rows, TextBatcher, length_groups, stack
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


@pytest.mark.parametrize("hidden_states", [False, True], ids=["embeddings", "hidden states"])
@pytest.mark.parametrize("budget", [16, 48, 1000])
def test_pooled_requests_each_answer_as_their_texts_alone(
    model: TextEncoderModel, budget: int, hidden_states: bool
) -> None:
    """Five requests queued together (in flight 5) are pooled and grouped; each text equals itself alone: its
    embedding, LayerNorm statistics and (asked, as V2 asks) hidden states over its own tokens."""
    batcher = TextBatcher(model, budget, delay_us=200_000, in_flight=lambda: len(TEXTS))
    alone = [model.infer(dataclasses.replace(model.tokenize([t]), hidden_states=True)) for t in TEXTS]
    results: dict[int, Rows] = {}

    def ask(i: int) -> None:
        request = model.tokenize([TEXTS[i], TEXTS[(i + 3) % len(TEXTS)]])
        results[i] = batcher.run(dataclasses.replace(request, hidden_states=hidden_states))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(TEXTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == list(range(len(TEXTS)))
    for i, rows in results.items():
        for row, k in enumerate((i, (i + 3) % len(TEXTS))):
            np.testing.assert_allclose(rows.embeddings[row], alone[k].sentence_embedding[0], rtol=0, atol=1e-5)
            for (name, mean, std), (want, m, s) in zip(rows.stats[row], alone[k].layer_norms, strict=True):
                assert name == want
                np.testing.assert_allclose(mean, m[0], rtol=0, atol=1e-5)
                np.testing.assert_allclose(std, s[0], rtol=0, atol=1e-5)
            hidden = alone[k].last_hidden_state
            assert hidden is not None
            want_hidden = hidden[0] if hidden_states else np.empty((0, hidden.shape[-1]))
            np.testing.assert_allclose(rows.hidden[row], want_hidden, rtol=0, atol=1e-5)


@pytest.mark.parametrize("way", ["text", "token ids"])
def test_v2_tensors_become_a_pooled_request_answering_as_one_run(model: TextEncoderModel, way: str) -> None:
    """Over the Open Inference Protocol a text encoder pools too: every output as one run of the request padded to
    its longest text, at its texts' own tokens, and 0 at padding."""
    plain = dataclasses.replace(model.tokenize(TEXTS), hidden_states=True)
    if way == "text":
        tensors = {"text": np.array(TEXTS, dtype=object)}  # the codecs hand BYTES on decoded
    else:
        tensors = {"input_ids": plain.input_ids, "attention_mask": plain.attention_mask}
    request = model.from_tensors(tensors, {}, Fields())
    assert isinstance(request, Pooled) and request.hidden_states and request.layer_norms
    got, want = model.infer(request), model.infer(plain)
    real = plain.attention_mask.astype(bool)
    assert got.last_hidden_state is not None and want.last_hidden_state is not None
    np.testing.assert_allclose(got.sentence_embedding, want.sentence_embedding, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got.last_hidden_state[real], want.last_hidden_state[real], rtol=0, atol=1e-5)
    assert not got.last_hidden_state[~real].any()
    for (name, mean, std), (want_name, m, s) in zip(got.layer_norms, want.layer_norms, strict=True):
        assert name == want_name
        np.testing.assert_allclose(mean[real], m[real], rtol=0, atol=1e-5)
        np.testing.assert_allclose(std[real], s[real], rtol=0, atol=1e-5)
        assert not mean[~real].any() and not std[~real].any()
