"""app/export/versions.py: versions staged in hidden folders and renamed into the repository whole."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from app.core.repository import Repository
from app.export.versions import commit, prepare, staging
from tests.live_server import ROOT

MANIFEST = {"kind": "layernorm", "config": {}}


def _stage(root: Path, name: str, content: str = "graph") -> Path:
    folder = root / f".export-{name}-test"
    folder.mkdir()
    (folder / "model.onnx").write_text(content)
    return folder


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_prepare_creates_a_missing_repository(tmp_path: Path) -> None:
    said: list[str] = []
    prepare(tmp_path / "a" / "models", said.append)
    assert (tmp_path / "a" / "models").is_dir() and said == []


def _old_layout(root: Path) -> None:
    """The single-manifest layout of normserve 0.1, rebuilt from the committed (migrated) models."""
    root.mkdir()
    models = {}
    for name in ("layernorm", "encoder"):
        entry = json.loads((ROOT / "models" / name / "1" / "manifest.json").read_text())
        shutil.copy(ROOT / "models" / name / "1" / "model.onnx", root / f"{name}.onnx")
        old = {k: v for k, v in entry.items() if k not in ("files", "format_version", "normserve", "versions")}
        old |= {"version": "1", "file": f"{name}.onnx", "sha256": entry["files"]["model.onnx"]}
        if "weights.npz" in entry["files"]:
            shutil.copy(ROOT / "models" / name / "1" / "weights.npz", root / f"{name}.npz")
            old["weights"] = {"file": f"{name}.npz", "sha256": entry["files"]["weights.npz"]}
        models[name] = old
    doc = {"format_version": 1, "normserve": "0.1.0", "versions": entry["versions"], "models": models}
    (root / "manifest.json").write_text(json.dumps(doc))


def test_prepare_migrates_the_old_layout_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "models"
    _old_layout(root)
    said: list[str] = []
    prepare(root, said.append)
    assert said == [f"migrated {root} from the old layout (manifest.json) into versions: encoder/1, layernorm/1"]
    repo = Repository(root)
    repo.check_layout()
    assert repo.names() == ["encoder", "layernorm"]
    for name in repo.names():
        assert repo.manifest(name, 1) == json.loads((ROOT / "models" / name / "1" / "manifest.json").read_text())


def test_a_new_name_gets_version_1_then_2(tmp_path: Path) -> None:
    for version in (1, 2):
        folder = _stage(tmp_path, "mine", f"graph {version}")
        assert commit(tmp_path, "mine", folder, MANIFEST) == version
    assert _listing(tmp_path) == [
        "mine",
        *(f"mine/{v}{f}" for v in (1, 2) for f in ("", "/manifest.json", "/model.onnx")),
    ]
    assert (tmp_path / "mine" / "1" / "model.onnx").read_text() == "graph 1"


def test_the_manifest_lists_every_file_with_its_sha256(tmp_path: Path) -> None:
    folder = _stage(tmp_path, "mine")
    (folder / "weights.npz").write_bytes(b"weights")
    commit(tmp_path, "mine", folder, MANIFEST)
    text = (tmp_path / "mine" / "1" / "manifest.json").read_text()
    files = {
        n: hashlib.sha256((tmp_path / "mine" / "1" / n).read_bytes()).hexdigest() for n in ("model.onnx", "weights.npz")
    }
    expected = {"format_version": 2, "name": "mine", "version": 1, **MANIFEST, "files": files}
    assert text == json.dumps(expected, indent=2, sort_keys=True) + "\n"


def test_a_given_version_is_replaced_whole(tmp_path: Path) -> None:
    commit(tmp_path, "layernorm", _stage(tmp_path, "layernorm", "old"), MANIFEST, 1)
    (tmp_path / "layernorm" / "1" / "stale.txt").write_text("from the old version")
    assert commit(tmp_path, "layernorm", _stage(tmp_path, "layernorm", "new"), MANIFEST, 1) == 1
    assert _listing(tmp_path) == ["layernorm", "layernorm/1", "layernorm/1/manifest.json", "layernorm/1/model.onnx"]
    assert (tmp_path / "layernorm" / "1" / "model.onnx").read_text() == "new"


def test_a_version_taken_meanwhile_moves_the_export_to_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit(tmp_path, "mine", _stage(tmp_path, "mine"), MANIFEST)
    rename = os.rename

    def racing(src: Path, dst: Path) -> None:  # another export lands version 2 just before this one
        if Path(dst).name == "2" and not Path(dst).exists():
            (Path(dst) / "model.onnx").parent.mkdir()
            (Path(dst) / "model.onnx").write_text("theirs")
        rename(src, dst)

    monkeypatch.setattr(os, "rename", racing)
    assert commit(tmp_path, "mine", _stage(tmp_path, "mine", "ours"), MANIFEST) == 3
    assert (tmp_path / "mine" / "2" / "model.onnx").read_text() == "theirs"
    assert json.loads((tmp_path / "mine" / "3" / "manifest.json").read_text())["version"] == 3


def test_staging_is_hidden_from_the_repository_and_removed_after(tmp_path: Path) -> None:
    with staging(tmp_path, "mine") as folder:
        assert folder.parent == tmp_path and folder.name.startswith(".export-mine-")
        (folder / "model.onnx").write_text("x")
        assert Repository(tmp_path).names() == []
    assert list(tmp_path.iterdir()) == []


def test_a_committed_version_is_readable_by_others(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        with staging(tmp_path, "mine") as folder:
            (folder / "model.onnx").write_text("x")
            commit(tmp_path, "mine", folder, MANIFEST)
    finally:
        os.umask(umask)
    assert (tmp_path / "mine" / "1").stat().st_mode & 0o777 == 0o755


def test_staging_refuses_a_name_the_repository_would_not_read(tmp_path: Path) -> None:
    with (
        pytest.raises(ValueError, match=r"^model: expected a model name matching .*, got '\.\./x'$"),
        staging(tmp_path, "../x"),
    ):
        pass
    assert list(tmp_path.iterdir()) == []
