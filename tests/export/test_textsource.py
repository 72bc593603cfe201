"""app/export/textsource.py: what a Hugging Face folder says (architecture, pooling, normalization, maximum length),
and every folder normserve refuses, by name, with nothing written."""

from __future__ import annotations

import datetime
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from app.export.exporter import main
from app.export.textexport import export_text_encoder
from app.export.textsource import Head, UnsupportedModel, chosen_head, read
from tests.textmodels import POSITIONS, TinyModel, tiny_model

Edit = Callable[[Path], None]


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return tiny_model(tmp_path_factory.mktemp("bert") / "hf", "bert")


@pytest.fixture(scope="module")
def roberta(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return tiny_model(tmp_path_factory.mktemp("roberta") / "hf", "roberta")


def _config(**changes: object) -> Edit:
    def edit(folder: Path) -> None:
        doc = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(doc | changes))

    return edit


def _write(name: str, doc: object) -> Edit:
    def edit(folder: Path) -> None:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(json.dumps(doc))

    return edit


def _remove(name: str) -> Edit:
    return lambda folder: (folder / name).unlink()


def _modules(*types: str) -> Edit:
    paths = ["", "1_Pooling", "2_Dense"]
    doc = [{"idx": i, "name": str(i), "path": paths[i], "type": t} for i, t in enumerate(types)]
    return _write("modules.json", doc)


ST = "sentence_transformers.sentence_transformer.modules"
REFUSALS = [
    (
        "another-model-type",
        _config(model_type="gpt2"),
        "{f}/config.json: model_type 'gpt2' is not supported; text encoders are one of bert, roberta, xlm-roberta, "
        "distilbert",
    ),
    (
        "auto-map",
        _config(auto_map={"AutoModel": "modeling_mine.MyModel"}),
        "{f}/config.json: auto_map: the model's code ships in the folder (trust_remote_code); normserve exports "
        "only transformers' own architectures and never runs code from a model folder",
    ),
    (
        "trust-remote-code",
        _config(trust_remote_code=True),
        "{f}/config.json: trust_remote_code: the model's code ships in the folder (trust_remote_code); normserve "
        "exports only transformers' own architectures and never runs code from a model folder",
    ),
    (
        "no-tokenizer-json",
        _remove("tokenizer.json"),
        "{f}: no tokenizer.json; the server tokenizes with it (the `tokenizers` library): save the model's fast "
        "tokenizer into the folder (AutoTokenizer.from_pretrained(...).save_pretrained(folder))",
    ),
    (
        "adapter",
        _write("adapter_config.json", {"peft_type": "LORA"}),
        "{f}: adapter_config.json: an adapter (PEFT) is not a whole model; merge it into its base model "
        "(merge_and_unload), save_pretrained that, and export the result",
    ),
    ("no-weights", _remove("model.safetensors"), "{f}: no weights; expected model.safetensors or pytorch_model.bin"),
    (
        "no-config",
        _remove("config.json"),
        "{f}: no config.json; --hf takes a folder as save_pretrained writes it",
    ),
    (
        "a-dense-module",
        _modules(f"{ST}.Transformer", f"{ST}.Pooling", f"{ST}.Dense"),
        f"{{f}}/modules.json: modules 2_Dense ({ST}.Dense); normserve exports a Transformer followed by Pooling and "
        "Normalize only",
    ),
    (
        "max-pooling",
        lambda f: (
            _modules(f"{ST}.Transformer", f"{ST}.Pooling")(f),
            _write("1_Pooling/config.json", {"pooling_mode": "max"})(f),
        ),
        "{f}/1_Pooling/config.json: pooling max; normserve pools with exactly one of mean, cls",
    ),
    (
        "legacy-two-poolings",
        lambda f: (
            _modules(f"{ST}.Transformer", f"{ST}.Pooling")(f),
            _write("1_Pooling/config.json", {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True})(f),
        ),
        "{f}/1_Pooling/config.json: pooling mean, max; normserve pools with exactly one of mean, cls",
    ),
]


@pytest.mark.parametrize(("edit", "message"), [(e, m) for _, e, m in REFUSALS], ids=[i for i, _, _ in REFUSALS])
def test_a_refused_folder_is_named_and_nothing_is_written(
    bert: TinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Edit, message: str
) -> None:
    folder = tmp_path / "hf"
    shutil.copytree(bert.path, folder)
    edit(folder)
    with pytest.raises(UnsupportedModel) as refused:
        read(folder)
    assert str(refused.value) == message.format(f=folder)
    root = tmp_path / "models"
    assert main(["text-encoder", "--name", "m", "--hf", str(folder), "--repository", str(root)]) == 1
    assert capsys.readouterr().err == f"normserve export: error: {message.format(f=folder)}\n"
    assert not root.exists()


def test_a_path_that_is_no_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModel) as refused:
        export_text_encoder(tmp_path / "models", "m", tmp_path / "missing")
    assert str(refused.value) == (
        f"{tmp_path / 'missing'}: not a folder; --hf takes a local folder as save_pretrained writes it"
    )
    assert not (tmp_path / "models").exists()


@pytest.mark.parametrize(
    ("model", "head"),
    [("bert", Head("mean", False, POSITIONS)), ("roberta", Head("mean", False, POSITIONS - 2))],
    ids=["bert-all-positions", "roberta-less-its-offset"],
)
def test_a_plain_folder_pools_the_mean_unnormalized_up_to_its_positions(
    request: pytest.FixtureRequest, model: str, head: Head
) -> None:
    tiny: TinyModel = request.getfixturevalue(model)
    source = read(tiny.path)
    assert (source.head, source.sentence_transformers) == (head, False)


@pytest.mark.parametrize(
    ("files", "head"),
    [
        (  # sentence-transformers before 6: a flag per mode, the length and lower-casing in sentence_bert_config.json
            {
                "1_Pooling/config.json": {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
                "sentence_bert_config.json": {"max_seq_length": 16, "do_lower_case": True},
            },
            Head("cls", True, 16, True),
        ),
        (  # sentence-transformers 6: one pooling_mode; the length is the tokenizer's, within the positions
            {"1_Pooling/config.json": {"pooling_mode": "mean"}, "tokenizer_config.json": {"model_max_length": 10**30}},
            Head("mean", True, POSITIONS),
        ),
    ],
    ids=["legacy-cls-16-lowercase", "st6-mean-positions"],
)
def test_a_sentence_transformers_folder_says_its_head(
    bert: TinyModel, tmp_path: Path, files: dict[str, object], head: Head
) -> None:
    folder = tmp_path / "st"
    shutil.copytree(bert.path, folder)
    _modules("sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling")(folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    for name, doc in files.items():
        _write(name, doc)(folder)
    assert read(folder).head == head


@pytest.mark.parametrize("length", [0, POSITIONS + 1])
def test_a_maximum_length_past_the_positions_is_refused(bert: TinyModel, length: int) -> None:
    with pytest.raises(ValueError) as refused:
        chosen_head(read(bert.path), None, None, length)
    assert str(refused.value) == (
        f"--max-sequence-length {length}: expected 1 to {POSITIONS}, the positions of {bert.path / 'config.json'}"
    )


def test_a_pytorch_model_bin_with_more_than_weights_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = tiny_model(tmp_path / "hf", "distilbert", safetensors=False)
    state = torch.load(tiny.path / "pytorch_model.bin", weights_only=True)
    torch.save(
        state | {"trained_on": datetime.date(2026, 1, 1)}, tiny.path / "pytorch_model.bin"
    )  # an object, not a tensor
    root = tmp_path / "models"
    capsys.readouterr()
    assert main(["text-encoder", "--name", "m", "--hf", str(tiny.path), "--repository", str(root)]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"normserve export: error: {tiny.path / 'pytorch_model.bin'}: holds more than weights (torch.load("
        "weights_only=True) refuses it); normserve never unpickles objects from a model folder: save the model with "
        "save_pretrained (model.safetensors)"
    )
    assert not root.exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--version", "0"], "argument --version: expected a positive integer version (1..2147483647), got '0'"),
        (["--tolerance", "0"], "argument --tolerance: expected a positive number, got '0'"),
        (["--tolerance", "nan"], "argument --tolerance: expected a positive number, got 'nan'"),
        (["--pooling", "max"], "argument --pooling: invalid choice: 'max' (choose from 'mean', 'cls', 'none')"),
    ],
    ids=["version-0", "tolerance-0", "tolerance-nan", "pooling-max"],
)
def test_a_bad_flag_is_refused_by_argparse_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["text-encoder", "--name", "m", "--hf", str(tmp_path), "--repository", str(tmp_path / "models"), *flags])
    assert refused.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"normserve export text-encoder: error: {message}"
    assert not (tmp_path / "models").exists()
