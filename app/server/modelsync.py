"""Explicit model control across the workers of one server: a load or unload applies to every worker before it answers.

A request reaches one worker. That worker takes the server's operation lock (a flock in the folder
its workers share, app/server/group.py), catches up with what the others published, and loads or
unloads as a single worker does: a failure answers 400 there and nothing serves differently
anywhere. Then it publishes the outcome, the next generation of the server's desired state (the
versions each model serves, and every version's state and reason, so that the repository index is
the same whichever worker answers), and waits until every live worker has applied it.

Each worker watches the state file every WATCH_INTERVAL_S and applies a newer generation: it builds
and warms up the versions it lacks, then retires those no longer wanted; requests already holding a
retired version finish on it. It acknowledges in its own file. A worker that starts later applies the
current generation before it reports ready.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from app.core.repository import Policy
from app.core.runtime import State, VersionState
from app.errors import ModelLoadFailed, ModelNotFound
from app.server import group
from app.server.control import LOAD_ERRORS, ModelControl

log = logging.getLogger("normserve.models")
T = TypeVar("T")
STATE = "state.json"
WATCH_INTERVAL_S = 0.05  # a stat() of one file: the delay before a peer starts applying a change
# A peer builds and warms up the same versions as the worker that answers, in about the same time (seconds);
# one that has not applied a change after this long is stuck, and the answer says which.
APPLY_TIMEOUT_S = 300.0
STARTING = -1  # the generation a worker acknowledges until it has started


def _write(path: Path, doc: dict[str, Any]) -> None:
    """Written beside, then renamed: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # the watcher writes too
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


class ModelSync:
    """One worker's side of the server's shared model state, in `folder`."""

    def __init__(self, control: ModelControl, folder: Path) -> None:
        self.control = control
        self.folder = folder
        self.applied = 0  # the generation this worker serves; 0: none published yet, the start-up models
        self.member = True  # False once its start-up failed: not ready, and no operation waits for it
        self._applying = threading.Lock()  # the watcher and a request's catch-up apply one at a time
        self._seen: tuple[int, int] | None = None  # (inode, mtime_ns) of the state file last read
        self._ack(STARTING)

    def run(self, operation: Callable[[], T], name: str) -> T:
        """A load or unload: alone in the server, then published, then applied by every worker."""
        with self._exclusive():
            self.catch_up()
            try:
                result = operation()
            except ModelLoadFailed:  # nothing serves differently, but the index shows the failure everywhere
                self._publish_and_wait(name)
                raise
            self._publish_and_wait(name)
            return result

    def published(self) -> dict[str, list[int]] | None:
        """The versions each model serves in the server's current generation; None before any load or unload."""
        doc = _read(self.folder / STATE)
        return None if doc is None else dict(doc["serving"])

    def started(self, failed: bool = False) -> None:
        """After the start-up models: the current generation applied, then acknowledged; before ready."""
        if failed:
            self.leave()
            return
        self.catch_up()
        self._ack(self.applied)

    def catch_up(self) -> None:
        """Apply the published generation if it is newer than what this worker serves."""
        doc = _read(self.folder / STATE)
        if doc is None:
            return
        with self._applying:
            if doc["generation"] <= self.applied:
                return
            try:
                self._apply(doc)
            except (*LOAD_ERRORS, ModelLoadFailed, ModelNotFound) as e:  # its folder gone meanwhile, too
                log.error("generation %s of the server's models: %s", doc["generation"], e)
                self.applied = doc["generation"]
                self._ack(self.applied, str(e))
                return
            self.applied = doc["generation"]
        self._ack(self.applied)

    def changed(self) -> bool:
        """Whether the state file changed since it was last looked at: the watcher's cheap test."""
        try:
            st = (self.folder / STATE).stat()
        except FileNotFoundError:
            return False
        seen, self._seen = self._seen, (st.st_ino, st.st_mtime_ns)  # each write renames a new file into place
        return seen != self._seen

    def _apply(self, doc: dict[str, Any]) -> None:
        runtime = self.control.runtime
        wanted: dict[str, list[int]] = doc["serving"]
        with runtime.lock:
            for name in sorted(set(runtime.serving) - set(wanted)):
                self.control.unload(name)
            for name, versions in sorted(wanted.items()):
                serving = runtime.serving.get(name, {})
                policy = Policy(**doc["policies"][name]) if name in doc.get("policies", {}) else None
                stale = policy is not None and any(m.policy != policy for m in serving.values())
                if set(serving) != set(versions) or stale:
                    self.control.serve_exactly(name, versions, policy)
            states = {}
            for key, (state, reason) in doc["states"].items():
                name, version = key.rsplit("/", 1)
                states[name, int(version)] = VersionState(State(state), reason)
            runtime.adopt(states)

    def _publish_and_wait(self, name: str) -> None:
        runtime = self.control.runtime
        with runtime.lock:
            generation = self._generation() + 1
            doc = {
                "generation": generation,
                "serving": {n: sorted(v) for n, v in runtime.serving.items()},
                # The model.json each model was loaded with: a peer builds with it, not with what is on disk later.
                "policies": {n: asdict(m.policy) for n, v in runtime.serving.items() for m in v.values() if m.policy},
                "states": {f"{n}/{v}": [s.state.value, s.reason] for (n, v), s in runtime.states.items()},
            }
            self.applied = generation
            self._ack(generation)
            _write(self.folder / STATE, doc)
        self._wait(generation, name)

    def _wait(self, generation: int, name: str) -> None:
        """Until every live worker of the server has applied `generation`; ModelLoadFailed names those that did not."""
        deadline = time.monotonic() + APPLY_TIMEOUT_S
        while True:
            late, failed = self._behind(generation)
            if failed:
                raise ModelLoadFailed(f"model {name!r}: {'; '.join(failed)}")
            if not late:
                return
            if time.monotonic() > deadline:
                pids = ", ".join(str(p) for p in late)
                raise ModelLoadFailed(
                    f"model {name!r}: applied here, but worker(s) {pids} did not apply it within {APPLY_TIMEOUT_S:g} s"
                )
            time.sleep(0.02)

    def _behind(self, generation: int) -> tuple[list[int], list[str]]:
        """The live workers that have not applied `generation` yet, and what those that failed to said."""
        late, failed = [], []
        for path in sorted(self.folder.glob("worker-*.json")):
            pid = int(path.stem.removeprefix("worker-"))
            if not group.alive(pid):
                path.unlink(missing_ok=True)  # a worker that died; its replacement registers anew
                continue
            ack = _read(path) or {"generation": STARTING}
            if ack.get("error") and ack["generation"] >= generation:
                failed.append(f"worker {pid} could not apply it: {ack['error']}")
            elif ack["generation"] < generation:
                late.append(pid)
        return late, failed

    def _generation(self) -> int:
        doc = _read(self.folder / STATE)
        return 0 if doc is None else int(doc["generation"])

    def _ack(self, generation: int, error: str | None = None) -> None:
        if self.member:
            _write(self.folder / f"worker-{os.getpid()}.json", {"generation": generation, "error": error})

    def leave(self) -> None:
        """At shutdown, or after a failed start: an operation no longer waits for this worker."""
        self.member = False
        (self.folder / f"worker-{os.getpid()}.json").unlink(missing_ok=True)

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        with (self.folder / "operation.lock").open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, also if this worker dies
            yield


async def watch(sync: ModelSync, starting: asyncio.Task[None], settle: Callable[[], None]) -> None:
    """After start-up: apply each generation another worker publishes, within WATCH_INTERVAL_S, then settle
    readiness (a model that failed at start may serve now)."""
    await starting
    while True:
        await asyncio.sleep(WATCH_INTERVAL_S)
        if not sync.changed():
            continue
        try:
            await asyncio.to_thread(sync.catch_up)
            settle()
        except Exception:  # a state file half gone with its folder: the next change is read again, the loop goes on
            log.exception("applying the server's model state from %s failed", sync.folder)
