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
current generation before it reports ready; until then an operation that reaches it answers 503 (run
there, its start-up would then override what it published). A peer that fails to apply a generation
makes the answering worker roll back to the previous one and publish that, so that they converge.

The folder is private (group.private); still, a file there is read as untrusted: a link, a FIFO, a
document of another shape or a generation gone back is logged and refuses operations with 503, never
applied (it unloaded every model, made the workers diverge, answered 500 or hung them).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from app.core.repository import parse_policy
from app.core.versionstate import State, VersionState
from app.errors import ModelLoadFailed, ModelNotFound, NotReady
from app.server import group
from app.server.control import LOAD_ERRORS, ModelControl
from app.server.operations import busy
from app.server.statefile import INVALID_ACK, STARTING, StateInvalid, checked, read_ack, read_state, write_state

log = logging.getLogger("normserve.models")
T = TypeVar("T")
STATE = "state.json"
WATCH_INTERVAL_S = 0.05  # a stat() of one file: the delay before a peer starts applying a change
LOCK_POLL_S = 0.02  # the server-wide lock is tried this often until the operation's deadline
# A peer builds and warms up the same versions as the worker that answers, in about the same time (seconds);
# one that has not applied a change after this long is stuck, and the answer says which.
APPLY_TIMEOUT_S = 300.0
INVALID = "the workers' shared model state ({}) is invalid: {}; no load or unload runs until the server restarts"


class PeersFailed(ModelLoadFailed):
    """Workers of the server could not apply a generation: which, and why."""


class ModelSync:
    """One worker's side of the server's shared model state, in `folder`."""

    def __init__(self, control: ModelControl, folder: Path, stopping: Callable[[], bool] = lambda: False) -> None:
        self.control = control
        self.folder = folder
        self.stopping = stopping  # a draining worker gives up waiting for the lock and for its peers
        self.applied = 0  # the generation this worker serves; 0: none published yet, the start-up models
        self.member = True  # False once its start-up failed: not ready, and no operation waits for it
        self.ready = False  # its start-up models loaded and the current generation applied
        self._applying = threading.Lock()  # the watcher and a request's catch-up apply one at a time
        self._seen: tuple[int, int] | None = None  # (inode, mtime_ns) of the state file last read
        # The watcher's own thread: never queued behind calls that wait for the server-wide lock (operations.py).
        self.watcher = ThreadPoolExecutor(1, thread_name_prefix="normserve-sync")
        self._ack(STARTING)

    def run(self, operation: Callable[[], T], name: str, action: str = "load", deadline: float | None = None) -> T:
        """A load or unload: alone in the server, then published, then applied by every worker. 503 while this
        worker starts (what it loads at start would not be what the others serve), or past the deadline."""
        if not self.ready:
            raise NotReady(
                f"cannot {action} model {name!r} yet: this worker of the server is still loading its start-up "
                "models; retry"
            )
        wait_s = APPLY_TIMEOUT_S if deadline is None else deadline - time.monotonic()
        with self._exclusive(action, time.monotonic() + wait_s, wait_s):
            self._current(strict=True)
            self.catch_up()
            before = self._document(self.applied)  # what every worker serves: restored if a peer cannot follow
            try:
                result = operation()
            except ModelLoadFailed:  # nothing serves differently, but the index shows the failure everywhere
                self._publish_and_wait(name)
                raise
            try:
                self._publish_and_wait(name)
            except PeersFailed as e:
                raise ModelLoadFailed(f"{e}; {self._roll_back(before, name)}") from None
            return result

    def published(self) -> dict[str, list[int]] | None:
        """The versions each model serves in the server's current generation; None before any load or unload
        (or when the state is invalid: the start-up models, and the error logged)."""
        doc = self._current()
        return None if doc is None else dict(doc["serving"])

    def started(self, failed: bool = False) -> None:
        """After the start-up models: the current generation applied, then acknowledged; before ready."""
        if failed:
            self.leave()
            return
        self.catch_up()
        self._ack(self.applied)
        self.ready = True

    def catch_up(self) -> None:
        """Apply the published generation if it is newer than what this worker serves."""
        doc = self._current()
        if doc is None:
            return
        with self._applying:
            if doc["generation"] <= self.applied:
                return
            try:
                self._apply(doc)
            except (*LOAD_ERRORS, ModelLoadFailed, ModelNotFound) as e:  # its folder gone meanwhile, too
                reason = self.control.repository.relative(str(e))
                log.error("generation %s of the server's models: %s", doc["generation"], reason)
                self.applied = doc["generation"]
                self._ack(self.applied, reason)
                return
            self.applied = doc["generation"]
        self._ack(self.applied)

    def _current(self, strict: bool = False) -> dict[str, Any] | None:
        """The published state, checked; None if none was published. An invalid one (or, for an operation, one
        whose generation went back) is logged and, if strict, refused with 503: applied, it would unload models or make
        the workers diverge; overwritten, it would hide that someone else writes there."""
        try:
            raw = read_state(self.folder / STATE)
            doc = None if raw is None else checked(raw)
            # Only under the server-wide lock: between its own publish's two steps the watcher may see one older.
            if strict and doc is not None and doc["generation"] < self.applied:
                raise StateInvalid(f"its generation {doc['generation']} is older than this worker's {self.applied}")
        except StateInvalid as e:
            log.error(INVALID.format(self.folder / STATE, e))
            if strict:
                raise NotReady(INVALID.format(STATE, e)) from None
            return None
        return doc

    def changed(self) -> bool:
        """Whether the state file changed since it was last looked at: the watcher's cheap test."""
        try:
            st = (self.folder / STATE).lstat()
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
                policy = parse_policy(doc["policies"][name], name) if name in doc["policies"] else None
                stale = policy is not None and any(m.policy != policy for m in serving.values())
                if set(serving) != set(versions) or stale:
                    self.control.serve_exactly(name, versions, policy)
            states = {}
            for key, (state, reason) in doc["states"].items():
                name, version = key.rsplit("/", 1)
                states[name, int(version)] = VersionState(State(state), reason)
            runtime.adopt(states)

    def _roll_back(self, before: dict[str, Any], name: str) -> str:
        """After a peer failed to apply a change (its files changed between this worker's load and the peer's):
        serve again what every worker served before, and publish it, so that the workers converge rather than
        serve different versions. What became of it, for the answer."""
        outcome = "rolled back: every worker serves what it served before"
        try:
            with self._applying:
                self._apply(before)
        except (*LOAD_ERRORS, ModelLoadFailed, ModelNotFound) as e:  # the versions before changed on disk too
            reason = self.control.repository.relative(str(e))
            log.error("rolling back model %s: %s; unloading it", name, reason, extra={"model": name})
            # What no worker can load again serves nowhere, rather than on some workers only.
            self.control.unload(name)
            outcome = f"rolling back failed too ({reason}): the model is unloaded on every worker; load it again"
        try:
            self._publish_and_wait(name)
        except ModelLoadFailed as e:
            log.error("rolling back model %s: %s", name, e, extra={"model": name})
            return f"rolling back failed too: {e}"
        return outcome

    def _document(self, generation: int) -> dict[str, Any]:
        """The state this worker serves, as a generation of the server's state."""
        runtime = self.control.runtime
        return {
            "generation": generation,
            "serving": {n: sorted(v) for n, v in runtime.serving.items()},
            # The model.json each model was loaded with: a peer builds with it, not with what is on disk later.
            "policies": {n: asdict(m.policy) for n, v in runtime.serving.items() for m in v.values() if m.policy},
            "states": {f"{n}/{v}": [s.state.value, s.reason] for (n, v), s in runtime.states.items()},
        }

    def _publish_and_wait(self, name: str) -> None:
        runtime = self.control.runtime
        with runtime.lock:
            generation = self._next_generation()
            doc = self._document(generation)
            self.applied = generation
            self._ack(generation)
            write_state(self.folder / STATE, doc)
        self._wait(generation, name)

    def _next_generation(self) -> int:
        """The file's next; without a file, past every generation any worker applied: a state file deleted (a temp
        cleaner) restarted at 1, which the workers at a higher one ignored, and they served on what they had."""
        doc = self._current(strict=True)
        if doc is not None:
            return int(doc["generation"]) + 1
        return max([self.applied, *(read_ack(path)[0] for path in self.folder.glob("worker-*.json"))]) + 1

    def _wait(self, generation: int, name: str) -> None:
        """Until every live worker of the server has applied `generation`; ModelLoadFailed names those that did not."""
        deadline = time.monotonic() + APPLY_TIMEOUT_S
        while True:
            late, failed = self._behind(generation)
            if failed:
                raise PeersFailed(f"model {name!r}: {'; '.join(failed)}")
            if not late:
                return
            if self.stopping():  # the shutdown must not wait for its peers: they apply it without this answer
                raise NotReady(f"model {name!r}: applied here, but this worker is shutting down before the others did")
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
            acked, error = read_ack(path)
            if error and (acked >= generation or acked == INVALID_ACK):
                failed.append(f"worker {pid} could not apply it: {error}")
            elif acked < generation:
                late.append(pid)
        return late, failed

    def _ack(self, generation: int, error: str | None = None) -> None:
        if self.member:
            write_state(self.folder / f"worker-{os.getpid()}.json", {"generation": generation, "error": error})

    def leave(self) -> None:
        """At shutdown, or after a failed start: an operation no longer waits for this worker."""
        self.member = False
        (self.folder / f"worker-{os.getpid()}.json").unlink(missing_ok=True)

    @contextmanager
    def _exclusive(self, action: str, deadline: float, wait_s: float) -> Iterator[None]:
        """The server-wide lock, tried until the deadline (503 then): a blocking flock could not be given up."""
        fd = os.open(self.folder / "operation.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "r+b") as f:  # the lock is released when the file closes, also if this worker dies
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if self.stopping():
                        raise NotReady("server is shutting down; retry on another replica") from None
                    if time.monotonic() > deadline:
                        raise busy(action, wait_s) from None
                    time.sleep(LOCK_POLL_S)
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
            await asyncio.get_running_loop().run_in_executor(sync.watcher, sync.catch_up)
            settle()
        except Exception:  # a state file half gone with its folder: the next change is read again, the loop goes on
            log.exception("applying the server's model state from %s failed", sync.folder)
