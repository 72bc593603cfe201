"""The files of the shared model-state folder (app/server/modelsync.py): written atomically, read as untrusted.

The folder is private (group.private); still, a file there may be a link, a FIFO or a document of another
shape left by something else: reading one refuses it with StateInvalid, naming what is wrong, and never
blocks on it or follows it.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

from app.core.repository import NAME, parse_policy
from app.core.versionstate import State
from app.errors import shown

MAX_STATE_BYTES = 16 * 1024 * 1024  # a state of thousands of versions is a few hundred KiB
STARTING = -1  # the generation a worker acknowledges until it has started
INVALID_ACK = -2  # the generation of an acknowledgement that is not one: its worker counts as failed


class StateInvalid(ValueError):
    """A file of the shared folder that no worker of this module wrote: what is wrong with it."""


def write_state(path: Path, doc: dict[str, Any]) -> None:
    """Written beside, then renamed: a reader sees the old file or the new one, never half of one. Created anew,
    private, never through a link someone left in its place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # the watcher writes too
    tmp.unlink(missing_ok=True)  # left by a worker that died writing, whose pid this one reuses
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc))
    os.replace(tmp, path)


def read_state(path: Path) -> Any | None:
    """A file's JSON, None if it does not exist; StateInvalid for a link, a FIFO or anything not a regular file
    (opened without blocking: a FIFO left in its place hung every worker that opened it), too large, or not JSON."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StateInvalid("a symbolic link" if e.errno == errno.ELOOP else os.strerror(e.errno or 0)) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StateInvalid("not a regular file")
        data = f.read(MAX_STATE_BYTES + 1)
    if len(data) > MAX_STATE_BYTES:
        raise StateInvalid(f"larger than {MAX_STATE_BYTES} bytes")
    try:
        return json.loads(data)
    except ValueError:
        raise StateInvalid("not JSON") from None


def generation_of(value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise StateInvalid(f"generation: expected an integer >= {minimum}, got {shown(value)}")
    return value


def _versions(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)


def checked(doc: object) -> dict[str, Any]:
    """The state document as a worker wrote it (generation, serving, policies, states), or StateInvalid naming
    the first field that is not."""
    if not isinstance(doc, dict) or set(doc) != {"generation", "serving", "policies", "states"}:
        raise StateInvalid("expected an object of generation, serving, policies and states")
    generation_of(doc["generation"], 1)
    serving, policies, states = doc["serving"], doc["policies"], doc["states"]
    if not isinstance(serving, dict) or not all(NAME.fullmatch(n) and _versions(v) for n, v in serving.items()):
        raise StateInvalid("serving: expected model names, each with a list of versions")
    if not isinstance(policies, dict) or set(policies) - set(serving):
        raise StateInvalid("policies: expected the policy of models that serve")
    for name, policy in policies.items():
        try:
            parse_policy(policy, f"policies.{name}")
        except ValueError as e:
            raise StateInvalid(str(e)) from None
    if not isinstance(states, dict):
        raise StateInvalid("states: expected an object")
    for key, value in states.items():
        name, _, version = key.rpartition("/")
        if not (NAME.fullmatch(name) and version.isascii() and version.isdigit()):
            raise StateInvalid(f"states: expected keys model/version, got {shown(key)}")
        if not (isinstance(value, list) and len(value) == 2 and value[0] in set(State) and isinstance(value[1], str)):
            raise StateInvalid(f"states.{key}: expected [state, reason]")
    return doc


def read_ack(path: Path) -> tuple[int, str | None]:
    """A worker's acknowledgement: (generation, error); an invalid one counts as a worker that failed."""
    try:
        doc = read_state(path)
        if doc is None:
            return STARTING, None
        if not isinstance(doc, dict) or not (doc.get("error") is None or isinstance(doc["error"], str)):
            raise StateInvalid("expected an object of generation and error")
        return generation_of(doc.get("generation"), STARTING), doc.get("error")
    except StateInvalid as e:
        return INVALID_ACK, f"its acknowledgement is invalid: {e}"
