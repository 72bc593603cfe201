"""Versions written into the model repository whole: built in a hidden folder, then renamed into place.

A version is staged in `<root>/.export-<name>-<random>/` (a sibling of the model folders, on the same
filesystem, hidden from Repository.names), its manifest.json written last with the sha256 of every
file beside it, and the folder renamed to `<root>/<name>/<version>` in one step: a reader sees no
version or a complete one. Replacing a version (the defaults' version 1) renames the old one aside
first, so there is a moment with no version 1, never a mixed one.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from app.core.repository import FORMAT_VERSION, MANIFEST, LegacyLayout, Repository, check_name, migrate
from app.export import graph

Progress = Callable[[str], None]
ATTEMPTS = 8  # new versions chosen in turn when concurrent exports to one name take the same number


def prepare(root: Path, say: Progress) -> None:
    """The repository ready for new versions: created if missing, the old single-manifest layout migrated."""
    try:
        Repository(root).check_layout()
    except LegacyLayout:
        moved = migrate(root)
        say(f"migrated {root} from the old layout (manifest.json) into versions: {', '.join(moved) or 'none'}")
    except FileNotFoundError:
        root.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def staging(root: Path, name: str) -> Iterator[Path]:
    """A new hidden folder for one version's files, removed on the way out (empty once committed)."""
    check_name(name)
    folder = root / f".export-{name}-{secrets.token_hex(4)}"
    folder.mkdir()  # not tempfile.mkdtemp: its 0700 would follow the rename and hide the version from the server
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def commit(root: Path, name: str, folder: Path, manifest: dict[str, Any], version: int | None = None) -> int:
    """Write the manifest into the staged folder and rename it into place; returns the version.

    version None: the next version of `name` (1 for a new model); a number: that version, replaced if present.
    """
    (root / check_name(name)).mkdir(exist_ok=True)
    if version is not None:
        _write_manifest(folder, name, version, manifest)
        _replace(folder, root / name / str(version))
        return version
    for _ in range(ATTEMPTS):
        version = Repository(root).next_version(name)
        _write_manifest(folder, name, version, manifest)
        try:
            os.rename(folder, root / name / str(version))  # fails if another export took this version meanwhile
        except OSError:
            if not (root / name / str(version)).exists():
                raise
            continue
        return version
    raise FileExistsError(f"{root / name}: {ATTEMPTS} versions were taken while exporting; export again")


def _write_manifest(folder: Path, name: str, version: int, manifest: dict[str, Any]) -> None:
    files = {p.name: graph.sha256(p) for p in sorted(folder.iterdir()) if p.name != MANIFEST}
    doc = {"format_version": FORMAT_VERSION, "name": name, "version": version, **manifest, "files": files}
    (folder / MANIFEST).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _replace(folder: Path, target: Path) -> None:
    """Rename folder to target; a target already there is renamed aside first and removed after."""
    old = target.with_name(f".{target.name}-replaced-{secrets.token_hex(4)}")
    had_old = target.exists()
    if had_old:
        os.rename(target, old)
    try:
        os.rename(folder, target)
    except OSError:
        if had_old:
            os.rename(old, target)  # put the old version back: never leave the model without it
        raise
    if had_old:
        shutil.rmtree(old)
