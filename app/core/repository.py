"""The model repository on disk, laid out as Triton's: `<root>/<name>/<version>/manifest.json` and the files it lists.

    models/
      layernorm/1/       model.onnx, manifest.json
      encoder/1/         model.onnx, weights.npz, manifest.json
      my-encoder/model.json      optional policy: version_policy, dynamic_batching
      my-encoder/1/ ...  my-encoder/2/ ...

Names and versions are checked here, once, before any path is built from them: a name matches
NAME and a version is a positive integer in canonical form, so neither can leave the root
(`..`, `/`, `%2e`, a drive or an absolute path never match). Nor can a link inside the root: a
folder or file that resolves outside it is not the repository's (Triton follows links anywhere).
This module reads; the exporter (app/export/) writes versions atomically and `migrate` moves the
old single-manifest layout.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import InvalidInput, ModelNotFound, shown

FORMAT_VERSION = 2  # of a version's manifest.json; 1 was the single models/manifest.json of every model
MANIFEST = "manifest.json"
POLICY = "model.json"
MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "weights.npz"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_VERSION = 2**31 - 1  # Triton's versions are int64, but nobody numbers past this: a bound for the parser
DEFAULT_POLICY: dict[str, Any] = {"latest": {"num_versions": 1}}


class LegacyLayout(RuntimeError):
    """The single models/manifest.json of normserve before the repository: refused, never misread."""


class PolicyError(ValueError):
    """A model.json that is not a policy Triton would accept."""


def check_name(name: object, field: str = "model") -> str:
    """A model name as the spec allows it, or 400/422 naming the field (404 would invite guessing paths)."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or name in (".", ".."):
        raise InvalidInput(f"expected a model name matching {NAME.pattern}, got {shown(name)}", field)
    return name


def check_version(version: object, field: str = "version") -> int:
    """A version as a positive integer: "1" or 1, never "01", "1e9", "-1" or "0"."""
    text = str(version) if isinstance(version, int) and not isinstance(version, bool) else version
    if not isinstance(text, str) or not re.fullmatch(r"[1-9][0-9]{0,9}", text) or int(text) > MAX_VERSION:
        raise InvalidInput(f"expected a positive integer version (1..{MAX_VERSION}), got {shown(version)}", field)
    return int(text)


@dataclass(frozen=True)
class Policy:
    """A model's model.json: which of its versions serve, and its dynamic batching (None: the server's settings)."""

    version_policy: dict[str, Any]
    dynamic_batching: dict[str, Any] | None = None

    def select(self, versions: list[int]) -> list[int]:
        """The versions to serve out of those on disk, highest first, as Triton's version_policy picks them."""
        ordered = sorted(versions, reverse=True)
        if "all" in self.version_policy:
            return ordered
        if "specific" in self.version_policy:
            wanted = set(self.version_policy["specific"]["versions"])
            return [v for v in ordered if v in wanted]
        return ordered[: self.version_policy["latest"]["num_versions"]]


def parse_policy(doc: Any, where: str) -> Policy:
    """model.json's content, checked: one of latest / all / specific, and dynamic_batching's numbers."""
    if not isinstance(doc, dict) or set(doc) - {"version_policy", "dynamic_batching"}:
        raise PolicyError(f"{where}: expected an object with version_policy and/or dynamic_batching")
    vp = doc.get("version_policy", DEFAULT_POLICY)
    if not isinstance(vp, dict) or len(vp) != 1 or next(iter(vp)) not in ("latest", "all", "specific"):
        raise PolicyError(f"{where}: version_policy must be one of latest, all or specific, got {shown(vp)}")
    kind, body = next(iter(vp.items()))
    if kind == "latest" and not (isinstance(body, dict) and _positive(body.get("num_versions"))):
        raise PolicyError(f"{where}: version_policy.latest.num_versions must be a positive integer")
    if kind == "specific" and not (
        isinstance(body, dict) and isinstance(body.get("versions"), list) and all(map(_positive, body["versions"]))
    ):
        raise PolicyError(f"{where}: version_policy.specific.versions must be a list of positive integers")
    batching = doc.get("dynamic_batching")
    if batching is not None:
        allowed = {"max_batch_size", "max_queue_delay_microseconds", "max_sequence_length"}
        if not isinstance(batching, dict) or set(batching) - allowed or not all(map(_natural, batching.values())):
            raise PolicyError(f"{where}: dynamic_batching takes non-negative integers {', '.join(sorted(allowed))}")
    return Policy(vp, batching)


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Repository:
    """What is on disk under one root; every path it builds comes from a checked name and version."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def check_layout(self) -> None:
        """LegacyLayout for the old single manifest; OSError if the root is not a folder."""
        legacy = self.root / MANIFEST
        if legacy.is_file():
            raise LegacyLayout(
                f"{legacy}: the single-manifest layout of normserve 0.1; move it into the repository layout "
                f"(<name>/<version>/) with `normserve models migrate --repository {self.root}`"
            )
        if not self.root.is_dir():
            raise FileNotFoundError(f"{self.root}: model repository missing; run `normserve export`")

    def names(self) -> list[str]:
        """Every model folder with a valid name (others are ignored, as Triton ignores them), sorted."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and NAME.fullmatch(p.name) and self._in(p))

    def _in(self, path: Path) -> bool:
        return path.resolve().is_relative_to(self.root.resolve())

    def inside(self, path: Path, error: Callable[[str], Exception] = lambda m: ModelNotFound(m, "model")) -> Path:
        """path, where it resolves (links followed) inside the root; else the error (a model or version that is
        not the repository's, by default): a link never has a name in a request read, or hash, anything outside."""
        if not self._in(path):
            raise error(f"{self.relative(str(path))} links outside the repository, which alone is read")
        return path

    def folder(self, name: str) -> Path:
        """The folder of a model, 404 when the repository has none of that (checked) name."""
        path = self.root / check_name(name)
        if not path.is_dir():
            available = ", ".join(self.names() if self.root.is_dir() else []) or "none"  # a typo shows the right name
            raise ModelNotFound(f"no model {name!r} in the repository; available: {available}", "model")
        return self.inside(path)

    def versions(self, name: str) -> list[int]:
        """The numbered version folders of a model, ascending (a folder named 01 or v2 is not a version)."""
        found = []
        for p in self.folder(name).iterdir():
            if p.is_dir() and re.fullmatch(r"[1-9][0-9]{0,9}", p.name) and int(p.name) <= MAX_VERSION and self._in(p):
                found.append(int(p.name))
        return sorted(found)

    def policy(self, name: str) -> Policy:
        path = self.folder(name) / POLICY
        if not path.is_file():
            return Policy(DEFAULT_POLICY)
        try:
            doc = json.loads(self.inside(path).read_bytes())
        except ValueError as e:
            raise PolicyError(f"{path}: not JSON ({e})") from None
        return parse_policy(doc, str(path))

    def version_dir(self, name: str, version: int) -> Path:
        return self.inside(self.folder(name) / str(check_version(version)))

    def manifest(self, name: str, version: int) -> dict[str, Any]:
        """A version's manifest.json; OSError or ValueError when it is missing or not what this server reads."""
        path = self.inside(self.version_dir(name, version) / MANIFEST)
        doc = json.loads(path.read_bytes())
        if not isinstance(doc, dict) or doc.get("format_version") != FORMAT_VERSION:
            got = doc.get("format_version") if isinstance(doc, dict) else None
            raise ValueError(f"{path}: format_version {got!r}; this server reads {FORMAT_VERSION}")
        return doc

    def next_version(self, name: str) -> int:
        """The version an export to `name` writes: one past the highest on disk, 1 for a new model."""
        check_name(name)
        if not (self.root / name).is_dir():
            return 1
        return max(self.versions(name), default=0) + 1

    def relative(self, text: str) -> str:
        """A text with the root taken off its paths: reasons are shown to clients (the index, readiness), which
        need the model's file, not where the server keeps its repository."""
        root = self.root
        for prefix in sorted({str(root.resolve()), str(root.absolute()), str(root)}, key=len, reverse=True):
            text = re.sub(rf"(?<![\w.-]){re.escape(prefix)}/", "", text)
        return text


def migrate(root: Path) -> list[str]:
    """Move the old layout (root/manifest.json listing every model) into <name>/1/; returns what moved.

    No torch: files move with their sha256s unchanged. Each version is written to a temporary
    folder and renamed into place, and the old manifest goes last, so an interrupted migration
    leaves the old layout readable and a second run finishes it."""
    legacy = Path(root) / MANIFEST
    doc = json.loads(legacy.read_bytes())
    moved = []
    for name, entry in sorted(doc["models"].items()):
        check_name(name)
        target = Path(root) / name / "1"
        if target.is_dir():
            continue  # moved by an earlier, interrupted run
        tmp = Path(root) / name / ".1-migrating"
        tmp.mkdir(parents=True, exist_ok=True)
        files = {MODEL_FILE: entry["sha256"]}
        os.replace(Path(root) / entry["file"], tmp / MODEL_FILE)
        if "weights" in entry:
            os.replace(Path(root) / entry["weights"]["file"], tmp / WEIGHTS_FILE)
            files[WEIGHTS_FILE] = entry["weights"]["sha256"]
        keep = {k: v for k, v in entry.items() if k not in ("file", "sha256", "weights", "name", "version")}
        manifest = {"format_version": FORMAT_VERSION, "name": name, "version": 1, **keep, "files": files}
        manifest |= {k: doc[k] for k in ("normserve", "versions") if k in doc}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, target)
        moved.append(f"{name}/1")
    legacy.unlink()
    return moved
