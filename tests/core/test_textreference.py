"""The BERT family's NumPy reference against the user's own model: tiny random Hugging Face models, padded batches.

Torch runs float32, the reference float64 on the same float32 weights: they agree within TORCH_ATOL. The weights
are redrawn larger than HF's initialization (std 0.02), and the LayerNorms' gamma and beta away from 1 and 0, so
that attention is far from uniform and a wrong mask, position or activation shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st_modules = pytest.importorskip("sentence_transformers.sentence_transformer.modules")

from app.core import textreference  # noqa: E402
from app.core.textreference import TextConfig  # noqa: E402
from tests import textmodels  # noqa: E402

TORCH_ATOL = 1e-5  # float32 torch vs float64 NumPy, hidden states of order 1
HIDDEN, LAYERS, HEADS, FFN, POSITIONS = textmodels.HIDDEN, textmodels.LAYERS, textmodels.HEADS, textmodels.FFN, 40
MODEL_TYPES = textmodels.MODEL_TYPES
Tiny = Callable[[str, str], tuple[Any, TextConfig]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    """(model_type, hidden_act) -> the tests/textmodels.py model as transformers loads it in eval mode with eager
    attention (the plain softmax(QK^T + mask) V the reference writes out), and its reference config as exported."""
    from app.export.textsource import architecture

    built: dict[tuple[str, str], tuple[Any, TextConfig]] = {}

    def get(model_type: str, hidden_act: str) -> tuple[Any, TextConfig]:
        if (model_type, hidden_act) not in built:
            folder = tmp_path_factory.mktemp(model_type)
            made = textmodels.tiny_model(folder, model_type, hidden_act=hidden_act)
            model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
            head = {"pooling": "mean", "normalize": False, "max_seq_length": made.max_positions}
            config = TextConfig.from_manifest({"config": architecture(model.config.to_dict()), **head})
            built[model_type, hidden_act] = model, config
        return built[model_type, hidden_act]

    return get


def padded_batch(config: TextConfig, seed: int = 1) -> dict[str, np.ndarray]:
    """Three texts of 11, 6 and 2 tokens padded to 11 with the pad token; token types for BERT."""
    rng = np.random.default_rng(seed)
    lengths = [11, 6, 2]
    mask = (np.arange(11)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    first = len(textmodels.BERT_SPECIALS)  # no special token inside a text
    ids = np.where(mask == 1, rng.integers(first, config.vocab_size, mask.shape), config.pad_token_id)
    batch = {"input_ids": ids, "attention_mask": mask}
    if config.has_token_types:
        batch["token_type_ids"] = (np.arange(11)[None, :] >= np.array([5, 3, 1])[:, None]).astype(np.int64) * mask
    return batch


def weights_of(model: Any) -> dict[str, np.ndarray]:
    """The state_dict as weights.npz holds it: float32 arrays (the reference widens them)."""
    return {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items() if v.is_floating_point()}


def run_torch(model: Any, batch: dict[str, np.ndarray]) -> Any:
    with torch.no_grad():
        return model(**{k: torch.from_numpy(v) for k, v in batch.items()}, output_hidden_states=True)


def run_reference(model: Any, config: TextConfig, batch: dict[str, np.ndarray]) -> textreference.TextOutputs:
    return textreference.encode(
        weights_of(model), config, batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids")
    )


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_last_hidden_state_matches_the_model_on_a_padded_batch(tiny: Tiny, model_type: str, hidden_act: str) -> None:
    model, config = tiny(model_type, hidden_act)
    batch = padded_batch(config)
    ours = run_reference(model, config, batch)
    theirs = run_torch(model, batch).last_hidden_state.numpy()
    assert ours.last_hidden_state.dtype == np.float64
    np.testing.assert_allclose(ours.last_hidden_state, theirs, rtol=0, atol=TORCH_ATOL)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_layer_norm_inputs_statistics_match_the_models_own_layer_norms(tiny: Tiny, model_type: str) -> None:
    """Each LayerNorm's input, caught by a forward pre-hook: its name, order, mean and population std."""
    model, config = tiny(model_type, "gelu")
    batch = padded_batch(config)
    caught: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def hook(name: str) -> Any:
        def record(_module: Any, args: tuple[Any, ...]) -> None:
            x = args[0].double()
            caught[name] = (x.mean(-1).numpy(), x.var(-1, correction=0).sqrt().numpy())

        return record

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.register_forward_pre_hook(hook(name))
    run_torch(model, batch)
    ours = run_reference(model, config, batch)
    assert list(ours.layer_norms) == list(caught) == textreference.layer_norm_names(config)
    for name, (mean, std) in caught.items():
        np.testing.assert_allclose(ours.layer_norms[name][0], mean, rtol=0, atol=TORCH_ATOL, err_msg=name)
        np.testing.assert_allclose(ours.layer_norms[name][1], std, rtol=0, atol=TORCH_ATOL, err_msg=name)


def test_distilberts_sinusoidal_positions_are_read_from_its_weights(tiny: Tiny) -> None:
    """sinusoidal_pos_embds: DistilBERT fills its position table with sines and cosines; the weights carry it."""
    _, config = tiny("distilbert", "gelu")
    config = TextConfig(**{**config.__dict__, "sinusoidal_pos_embds": True})
    torch.manual_seed(0)
    sizes = {"dim": HIDDEN, "n_layers": LAYERS, "n_heads": HEADS, "hidden_dim": FFN, "sinusoidal_pos_embds": True}
    hf = transformers.DistilBertConfig(
        vocab_size=config.vocab_size, max_position_embeddings=POSITIONS, pad_token_id=config.pad_token_id, **sizes
    )
    hf._attn_implementation = "eager"
    model = transformers.DistilBertModel(hf).eval()
    table = model.embeddings.position_embeddings.weight.detach().numpy()
    frequencies = 1 / np.power(10000, np.arange(0, HIDDEN, 2) / HIDDEN)
    np.testing.assert_allclose(table[1, 0::2], np.sin(frequencies), atol=1e-6)
    batch = padded_batch(config)
    ours = run_reference(model, config, batch).last_hidden_state
    np.testing.assert_allclose(ours, run_torch(model, batch).last_hidden_state.numpy(), rtol=0, atol=TORCH_ATOL)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_sentence_embedding_is_sentence_transformers_pooling(
    tiny: Tiny, model_type: str, pooling: str, normalize: bool
) -> None:
    model, config = tiny(model_type, "gelu")
    config = TextConfig(**{**config.__dict__, "pooling": pooling, "normalize": normalize})
    batch = padded_batch(config)
    hidden = run_torch(model, batch).last_hidden_state
    features = {"token_embeddings": hidden, "attention_mask": torch.from_numpy(batch["attention_mask"])}
    features = st_modules.Pooling(HIDDEN, pooling_mode=pooling)(features)
    if normalize:
        features = st_modules.Normalize()(features)
    ours = run_reference(model, config, batch).sentence_embedding
    np.testing.assert_allclose(ours, features["sentence_embedding"].numpy(), rtol=0, atol=TORCH_ATOL)
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=0, atol=1e-12)


def test_mean_pooling_ignores_padding_and_cls_takes_the_first_token() -> None:
    h = np.arange(2 * 3 * 2, dtype=np.float64).reshape(2, 3, 2)  # B=2, T=3, C=2
    mask = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    np.testing.assert_array_equal(textreference.pool(h, mask, "mean"), [[1.0, 2.0], [6.0, 7.0]])
    np.testing.assert_array_equal(textreference.pool(h, mask, "cls"), [[0.0, 1.0], [6.0, 7.0]])


@pytest.mark.parametrize(
    ("model_type", "expected"),
    [
        ("bert", [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]),
        ("distilbert", [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]),
        ("roberta", [[2, 3, 4, 5, 6], [2, 3, 4, 1, 1]]),  # after the padding index; padding at it
        ("xlm-roberta", [[2, 3, 4, 5, 6], [2, 3, 4, 1, 1]]),
    ],
)
def test_position_ids_follow_each_architecture(tiny: Tiny, model_type: str, expected: list[list[int]]) -> None:
    _, config = tiny(model_type, "gelu")
    pad = config.pad_token_id
    ids = np.array([[0, 5, 6, 7, 2], [0, 5, 2, pad, pad]])
    np.testing.assert_array_equal(textreference.position_ids(ids, config), expected)


VOCAB = 50  # the manifest's in the tests of TextConfig.from_manifest


def manifest(**changes: Any) -> dict[str, Any]:
    config = {
        "model_type": "bert",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": FFN,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": POSITIONS,
        "type_vocab_size": 2,
        "pad_token_id": 0,
        "position_offset": 0,
        "sinusoidal_pos_embds": False,
    }
    head = {"pooling": "mean", "normalize": True, "max_seq_length": 32}
    for key, value in changes.items():
        (head if key in head else config)[key] = value
    return {"kind": "text-encoder", "config": config, **head}


def test_config_from_manifest_reads_the_architecture_and_the_head() -> None:
    config = TextConfig.from_manifest(manifest())
    assert (config.model_type, config.hidden_size, config.layer_norm_eps) == ("bert", HIDDEN, 1e-12)
    assert (config.pooling, config.normalize, config.max_seq_length, config.has_token_types) == ("mean", True, 32, True)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"model_type": "gpt2"},
            "config.model_type 'gpt2'; expected one of ('bert', 'roberta', 'xlm-roberta', 'distilbert')",
        ),
        (
            {"hidden_act": "tanh"},
            "config.hidden_act 'tanh'; expected one of ('gelu', 'gelu_new', "
            "'gelu_pytorch_tanh', 'relu', 'silu', 'swish')",
        ),
        ({"pooling": "max"}, "pooling 'max'; expected one of ('mean', 'cls', 'none')"),
        ({"hidden_size": 0}, "config.hidden_size 0; expected a positive integer"),
        ({"pad_token_id": -1}, "config.pad_token_id -1; expected a non-negative integer"),
        ({"layer_norm_eps": "1e-12"}, "config.layer_norm_eps '1e-12'; expected a positive finite number"),
        ({"normalize": 1}, "normalize 1; expected true or false"),
        ({"max_seq_length": None}, "max_seq_length None; expected a positive integer"),
        ({"num_attention_heads": 5}, "config.num_attention_heads 5 does not divide config.hidden_size 32"),
        ({"pad_token_id": 50}, "config.pad_token_id 50 is outside the vocabulary (config.vocab_size 50)"),
        (
            {"max_seq_length": 41},
            "max_seq_length 41 + config.position_offset 0 is past config.max_position_embeddings 40",
        ),
    ],
    ids=str.split("model_type hidden_act pooling size pad eps normalize max_seq_length heads pad_outside_vocab long"),
)
def test_config_from_manifest_refuses_a_bad_field_by_name(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as e:
        TextConfig.from_manifest(manifest(**changes))
    assert str(e.value) == message
