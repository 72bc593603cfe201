"""The workers of one server: who they are, the gRPC port they alone may share, the folder they share.

uvicorn's `--workers N` (and `normserve serve`, which runs it) starts the workers as spawned children
of one parent, whose pid and start time name the server (`server_id`). Workers forked by a pre-fork
manager (gunicorn), and a server given its socket (`uvicorn --fd`), hold the HTTP listening socket
before they bind anything: its inode names the server. A server alone is named by its own pid. So
the workers of one server agree on the name and no other server has it.

gRPC: every worker binds the port with SO_REUSEPORT, which Linux grants to any process of the same
user, so a second server would silently share the port and take some of the first one's calls. A
claim file per port says which server owns it: each worker of the owner holds a shared flock on it
for its lifetime (`normserve serve` holds one too, before its workers start), and a worker of another
server finds it held under another id and refuses to start. A short exclusive lock on a second file
makes the check-and-claim one step. A port nobody holds a lock on is free again, whatever the file
says: a killed server leaves nothing to clean.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from app.settings import Settings

ENV_HINT = "--grpc-port or NORMSERVE_GRPC_PORT"
RUNTIME_HINT = "remove it, or set NORMSERVE_RUNTIME_DIR to a folder of this user's own"


class PortTaken(RuntimeError):
    """The gRPC port belongs to another server (or cannot be claimed): the message names the port and the settings."""


def started_at(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22): a pid reused later differs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "0"
    return stat.rsplit(")", 1)[1].split()[19]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def server_pid() -> int:
    """The pid of the server this process is a worker of: the parent that spawned it, or itself."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None and parent.pid is not None else os.getpid()


def one_of_several() -> bool:
    """Whether this process was spawned as one of a server's workers (uvicorn --workers N, `normserve serve`)."""
    return multiprocessing.parent_process() is not None


def _listening_inodes() -> set[str]:
    """The inodes of the TCP sockets that listen in this network namespace (/proc/net/tcp and tcp6)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = [line.split() for line in Path(table).read_text().splitlines()[1:]]
        except OSError:
            continue
        inodes.update(row[9] for row in rows if row[3] == "0A")  # st 0A: LISTEN
    return inodes


def inherited_listener() -> str | None:
    """The inode of a listening TCP socket that this process holds (before it binds any itself: inherited), or None."""
    listening = _listening_inodes()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:[") and target[8:-1] in listening:
            return target[8:-1]
    return None


def server_id() -> str:
    """This server's identity, the same in all of its workers (module docstring)."""
    if one_of_several():
        pid = server_pid()
        return f"{pid}-{started_at(pid)}"
    if (inode := inherited_listener()) is not None:
        return f"socket-{inode}"
    return f"{os.getpid()}-{started_at(os.getpid())}"


def runtime_dir() -> Path:
    """Where the claims and the shared folders live: per user, since SO_REUSEPORT only pairs one user's sockets.

    NORMSERVE_RUNTIME_DIR, else $XDG_RUNTIME_DIR/normserve (a folder of the user's own), else the temporary
    directory's normserve-UID; created 0700, and refused (UnsafeFolder) unless this user's alone: another user who
    made the temporary one first could rewrite the workers' model state and hold the gRPC port's claim."""
    configured = Settings().runtime_dir
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if configured:
        folder = Path(configured)
    elif xdg:
        folder = Path(xdg) / "normserve"
    else:
        folder = Path(tempfile.gettempdir()) / f"normserve-{os.getuid()}"
    return private(folder)


class UnsafeFolder(RuntimeError):
    """A folder the server keeps its own state in that another user owns, or may write: the message says which."""


def private(folder: Path) -> Path:
    """The folder, made 0700 if missing; UnsafeFolder if it is a link, not a folder, another user's, or open to
    others (never repaired: whoever made it so may have written in it already)."""
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise UnsafeFolder(f"{folder}: cannot create it ({e.strerror}); {RUNTIME_HINT}") from None
    st = folder.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolder(f"{folder}: not a folder (a link or a file); {RUNTIME_HINT}")
    if st.st_uid != os.geteuid():
        raise UnsafeFolder(
            f"{folder}: owned by uid {st.st_uid}, not by this server's uid {os.geteuid()}; {RUNTIME_HINT}"
        )
    if st.st_mode & 0o077:
        raise UnsafeFolder(
            f"{folder}: mode {stat.S_IMODE(st.st_mode):04o}, open to other users, not 0700; {RUNTIME_HINT}"
        )
    return folder


def shared_dir() -> Path:
    """A folder that the workers of this server share (app/server/modelsync.py), created 0700 by the first to ask."""
    return private(runtime_dir() / f"server-{server_id()}")


def reap_shared_dirs() -> list[Path]:
    """Remove the shared folders of servers that are gone (their parent's pid ended or was reused)."""
    gone = []
    for folder in runtime_dir().glob("server-*-*"):
        pid, started = folder.name.removeprefix("server-").split("-", 1)
        if pid.isdigit() and started_at(int(pid)) != started:
            shutil.rmtree(folder, ignore_errors=True)  # another worker may be reaping it at the same moment
            gone.append(folder)
    return gone


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # held for a read and a write: never long
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def claim_grpc_port(port: int, owner: str | None = None, hint: str = ENV_HINT) -> IO[str]:
    """Claim the port for this server: the open claim file, whose shared lock lasts until it is closed.

    PortTaken if another server holds it."""
    owner = owner or server_id()
    try:
        folder = runtime_dir()
    except UnsafeFolder as e:
        raise PortTaken(f"cannot claim gRPC port {port}: {e}") from None
    with _exclusive(folder / f"grpc-{port}.lock"):
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        claim = os.fdopen(os.open(folder / f"grpc-{port}.owner", flags, 0o600), "a+")
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held: by this server's other workers, or by another server
            claim.seek(0)
            holder, _, pid = claim.read().partition(" ")
            if holder != owner:
                claim.close()
                raise PortTaken(
                    f"gRPC port {port} is already in use by another normserve server (pid {pid}); "
                    f"choose another with {hint}"
                ) from None
        else:  # nobody holds it: this server's now
            claim.truncate(0)
            claim.write(f"{owner} {server_pid()}")
            claim.flush()
        fcntl.flock(claim, fcntl.LOCK_SH)  # downgraded under the exclusive lock: nobody can claim in between
        return claim
