"""app/core/repository.py: names and versions no path can escape with, Triton's version policies, the old layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from app.core.model import sha256_of
from app.core.repository import (
    FORMAT_VERSION,
    LegacyLayout,
    Policy,
    PolicyError,
    Repository,
    check_name,
    check_version,
    migrate,
    parse_policy,
)
from app.errors import InvalidInput, ModelNotFound
from tests.live_server import MODELS
from tests.repositories import add_version, copy_models


@pytest.mark.parametrize("name", ["layernorm", "my-encoder", "a", "A.b_c-9", "x" * 64, "1st"])
def test_names_of_the_spec_are_accepted(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "../x",
        "..%2fx",
        "%2e%2e",
        "/etc/passwd",
        "a/b",
        "a\\b",
        "-x",
        "_x",
        ".hidden",
        "x" * 65,
        "x" * 10_000,
        "café",
        "a b",
        "a\0b",
        7,
        None,
    ],
)
def test_names_that_could_leave_the_repository_are_refused_naming_the_field(name: Any) -> None:
    with pytest.raises(InvalidInput) as e:
        check_name(name, "model_name")
    assert e.value.field == "model_name"
    assert str(e.value).startswith("model_name: expected a model name matching [A-Za-z0-9][A-Za-z0-9_.-]{0,63}, got ")
    assert len(str(e.value)) < 250  # a 10,000-character name is not echoed whole


@pytest.mark.parametrize(("version", "number"), [("1", 1), (1, 1), ("12", 12), ("2147483647", 2**31 - 1)])
def test_versions_are_positive_integers(version: object, number: int) -> None:
    assert check_version(version) == number


@pytest.mark.parametrize("version", ["0", 0, "-1", -1, "1e9", "01", "1.0", 1.0, " 1", "", "2147483648", True, None])
def test_other_versions_are_refused(version: object) -> None:
    with pytest.raises(InvalidInput) as e:
        check_version(version)
    assert str(e.value).startswith("version: expected a positive integer version (1..2147483647), got ")


@pytest.mark.parametrize(
    ("policy", "selected"),
    [
        ({}, [5]),
        ({"version_policy": {"latest": {"num_versions": 2}}}, [5, 3]),
        ({"version_policy": {"latest": {"num_versions": 9}}}, [5, 3, 1]),
        ({"version_policy": {"all": {}}}, [5, 3, 1]),
        ({"version_policy": {"specific": {"versions": [1, 3, 4]}}}, [3, 1]),
    ],
    ids=["default-latest-1", "latest-2", "latest-more-than-there-are", "all", "specific"],
)
def test_a_version_policy_selects_as_tritons_does(policy: dict[str, Any], selected: list[int]) -> None:
    assert parse_policy(policy, "model.json").select([1, 3, 5]) == selected


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "model.json: expected an object with version_policy and/or dynamic_batching"),
        ({"instance_group": []}, "model.json: expected an object with version_policy and/or dynamic_batching"),
        (
            {"version_policy": {"newest": {}}},
            "model.json: version_policy must be one of latest, all or specific, got {'newest': {}}",
        ),
        (
            {"version_policy": {"latest": {"num_versions": 0}}},
            "model.json: version_policy.latest.num_versions must be a positive integer",
        ),
        (
            {"version_policy": {"specific": {"versions": ["1"]}}},
            "model.json: version_policy.specific.versions must be a list of positive integers",
        ),
        (
            {"dynamic_batching": {"max_batch_size": -1}},
            "model.json: dynamic_batching takes non-negative integers max_batch_size, max_queue_delay_microseconds, max_sequence_length",
        ),
    ],
    ids=["not-an-object", "unknown-field", "unknown-policy", "latest-zero", "specific-strings", "negative-batching"],
)
def test_a_policy_triton_would_refuse_is_refused(doc: Any, message: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(doc, "model.json")
    assert str(e.value) == message


@pytest.fixture
def repo(tmp_path: Path) -> Repository:
    return Repository(copy_models(tmp_path / "models"))


def test_names_and_versions_are_the_folders_that_match(repo: Repository) -> None:
    add_version(repo.root, "layernorm", 3)
    for junk in ("layernorm/01", "layernorm/v2", "layernorm/.4-tmp", ".git", "bad name"):
        (repo.root / junk).mkdir(parents=True)
    (repo.root / "README.md").write_text("not a model")
    assert repo.names() == ["encoder", "encoder-preln", "layernorm"]
    assert repo.versions("layernorm") == [1, 3]
    assert repo.next_version("layernorm") == 4 and repo.next_version("new-model") == 1


def test_a_models_policy_comes_from_its_model_json(repo: Repository) -> None:
    assert repo.policy("encoder") == Policy({"latest": {"num_versions": 1}})
    (repo.root / "encoder/model.json").write_text(json.dumps({"version_policy": {"all": {}}}))
    assert repo.policy("encoder").version_policy == {"all": {}}
    (repo.root / "encoder/model.json").write_text("{")
    with pytest.raises(PolicyError) as e:
        repo.policy("encoder")
    assert str(e.value).startswith(f"{repo.root}/encoder/model.json: not JSON (")


@pytest.mark.parametrize(
    ("names", "available"),
    [
        (("layernorm", "encoder", "encoder-preln"), "encoder, encoder-preln, layernorm"),
        ((), "none"),
        (None, "none"),  # no repository folder at all
    ],
    ids=["three", "empty", "no-folder"],
)
def test_a_name_the_repository_does_not_have_is_not_found_naming_those_it_has(
    tmp_path: Path, names: tuple[str, ...] | None, available: str
) -> None:
    root = tmp_path / "models" if names is None else copy_models(tmp_path / "models", names)
    with pytest.raises(ModelNotFound) as e:
        Repository(root).versions("layernrom")
    assert str(e.value) == f"model: no model 'layernrom' in the repository; available: {available}"


def test_a_manifest_of_another_format_is_refused(repo: Repository) -> None:
    manifest = repo.manifest("layernorm", 1)
    assert manifest["format_version"] == FORMAT_VERSION and manifest["kind"] == "layernorm"
    (repo.root / "layernorm/1/manifest.json").write_text(json.dumps({**manifest, "format_version": 1}))
    with pytest.raises(ValueError) as e:
        repo.manifest("layernorm", 1)
    assert str(e.value) == f"{repo.root}/layernorm/1/manifest.json: format_version 1; this server reads 2"


def _legacy(root: Path) -> dict[str, Any]:
    """The old layout, rebuilt from the repository: every file flat beside one models/manifest.json."""
    root.mkdir()
    models: dict[str, Any] = {}
    for name in ("layernorm", "encoder"):
        manifest = json.loads((MODELS / name / "1/manifest.json").read_text())
        shutil.copyfile(MODELS / name / "1/model.onnx", root / f"{name}.onnx")
        entry = {k: v for k, v in manifest.items() if k not in ("files", "format_version", "normserve", "versions")}
        entry |= {"file": f"{name}.onnx", "sha256": manifest["files"]["model.onnx"], "version": "1"}
        if "weights.npz" in manifest["files"]:
            shutil.copyfile(MODELS / name / "1/weights.npz", root / f"{name}.npz")
            entry["weights"] = {"file": f"{name}.npz", "sha256": manifest["files"]["weights.npz"]}
        models[name] = entry
    doc = {"format_version": 1, "normserve": "0.1.0", "models": models}
    (root / "manifest.json").write_text(json.dumps(doc))
    return doc


def test_the_old_layout_is_refused_saying_how_to_migrate_it(tmp_path: Path) -> None:
    _legacy(tmp_path / "old")
    with pytest.raises(LegacyLayout) as e:
        Repository(tmp_path / "old").check_layout()
    assert str(e.value) == (
        f"{tmp_path}/old/manifest.json: the single-manifest layout of normserve 0.1; move it into the repository "
        f"layout (<name>/<version>/) with `normserve models migrate --repository {tmp_path}/old`"
    )


def test_migrate_moves_every_model_into_version_1_with_its_sha256s(tmp_path: Path) -> None:
    root = tmp_path / "old"
    _legacy(root)
    assert migrate(root) == ["encoder/1", "layernorm/1"]
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == [
        "encoder/1/manifest.json",
        "encoder/1/model.onnx",
        "encoder/1/weights.npz",
        "layernorm/1/manifest.json",
        "layernorm/1/model.onnx",
    ]
    repo = Repository(root)
    repo.check_layout()
    for name in ("encoder", "layernorm"):
        manifest = repo.manifest(name, 1)
        assert manifest["files"] == {f: sha256_of(root / name / "1" / f) for f in manifest["files"]}
        assert manifest["files"] == json.loads((MODELS / name / "1/manifest.json").read_text())["files"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{root}/ln/2/model.onnx: sha256 differs", "ln/2/model.onnx: sha256 differs"),
        ("{absolute}/ln/2/manifest.json: manifest missing", "ln/2/manifest.json: manifest missing"),
        ("{root}-old/ln/2/model.onnx: elsewhere", "{root}-old/ln/2/model.onnx: elsewhere"),
        (
            "NORMSERVE_STARTUP_MODELS names ln: not in the repository",
            "NORMSERVE_STARTUP_MODELS names ln: not in the repository",
        ),
    ],
    ids=["as-given", "absolute", "a-sibling-folder-stays", "no-path"],
)
def test_relative_takes_the_root_off_the_paths_of_a_reason(tmp_path: Path, text: str, expected: str) -> None:
    root = tmp_path / "models"
    repo = Repository(root)
    fill = {"root": str(root), "absolute": str(root.resolve())}
    assert repo.relative(text.format(**fill)) == expected.format(**fill)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the repository, holding a model, a version and a file that links in the repository may name."""
    place = copy_models(tmp_path / "outside", ("layernorm",))
    (place / "secret.txt").write_text("not the repository's")
    return place


def test_a_model_folder_linking_outside_the_repository_is_not_one_of_its_models(
    repo: Repository, outside: Path
) -> None:
    (repo.root / "evil").symlink_to(outside / "layernorm")
    assert "evil" not in repo.names()
    with pytest.raises(ModelNotFound) as e:
        repo.versions("evil")
    assert str(e.value) == "model: evil links outside the repository, which alone is read"


def test_a_version_folder_linking_outside_is_not_a_version(repo: Repository, outside: Path) -> None:
    (repo.root / "layernorm/5").symlink_to(outside / "layernorm/1")
    assert repo.versions("layernorm") == [1]
    with pytest.raises(ModelNotFound) as e:
        repo.manifest("layernorm", 5)
    assert str(e.value) == "model: layernorm/5 links outside the repository, which alone is read"


@pytest.mark.parametrize("file", ["manifest.json", "model.json"])
def test_a_file_linking_outside_is_not_read(repo: Repository, outside: Path, file: str) -> None:
    link = repo.root / "layernorm" / ("1" if file == "manifest.json" else "") / file
    link.unlink(missing_ok=True)
    link.symlink_to(outside / "secret.txt")
    with pytest.raises(ModelNotFound) as e:
        repo.manifest("layernorm", 1) if file == "manifest.json" else repo.policy("layernorm")
    assert str(e.value) == f"model: {link.relative_to(repo.root)} links outside the repository, which alone is read"


def test_links_that_stay_inside_the_repository_are_followed(tmp_path: Path) -> None:
    """As a Kubernetes volume lays a repository out: the root and its folders links into the same tree."""
    real = copy_models(tmp_path / "volume/..2026_11_27", ("layernorm",))
    (tmp_path / "volume/..data").symlink_to(real.name)
    (tmp_path / "volume/layernorm").symlink_to("..data/layernorm")
    (tmp_path / "models").symlink_to(tmp_path / "volume")
    repo = Repository(tmp_path / "models")
    assert repo.names() == ["layernorm"] and repo.versions("layernorm") == [1]
    assert repo.manifest("layernorm", 1)["kind"] == "layernorm"
