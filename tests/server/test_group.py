"""The workers of one server: one identity, the gRPC port's claim (shared by them, refused to others), their folder."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from app.server import group
from benchmarks.servers import ROOT, free_port


def test_a_claim_is_shared_by_the_workers_of_one_server_and_refused_to_another() -> None:
    port = free_port()
    first = group.claim_grpc_port(port, owner="111-5")
    second = group.claim_grpc_port(port, owner="111-5")  # a second worker of the same server
    with pytest.raises(group.PortTaken) as refused:
        group.claim_grpc_port(port, owner="222-7")
    assert str(refused.value) == (
        f"gRPC port {port} is already in use by another normserve server (pid {os.getpid()}); "
        "choose another with --grpc-port or NORMSERVE_GRPC_PORT"
    )
    first.close()
    with pytest.raises(group.PortTaken):  # one worker of the owner still holds it
        group.claim_grpc_port(port, owner="222-7")
    second.close()
    group.claim_grpc_port(port, owner="222-7").close()  # nobody holds it: free again, whatever the file says


def test_a_claim_ends_with_the_process_that_held_it() -> None:
    port = free_port()
    held = f"from app.server import group; c = group.claim_grpc_port({port}, owner='333-1'); print('held', flush=True)"
    with subprocess.Popen(
        [sys.executable, "-c", held + "; input()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
            with pytest.raises(group.PortTaken):
                group.claim_grpc_port(port, owner="444-1")
        finally:
            proc.kill()
    group.claim_grpc_port(port, owner="444-1").close()


def test_a_process_started_alone_is_its_own_server_and_names_its_start_time() -> None:
    """In a fresh interpreter: this one may hold a listening socket an earlier test left it (an inherited one)."""
    code = "import os; from app.server import group; print(os.getpid(), group.server_id())"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    child_pid, answer = child.stdout.split()
    pid, started = answer.split("-")
    assert pid == child_pid and started.isdigit() and int(started) > 0


def test_a_spawned_worker_names_the_server_that_spawned_it() -> None:
    code = "from tests.server.test_group import _child_id; _child_id()"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    parent_pid, child_answer = child.stdout.split()
    assert child_answer.split("-")[0] == parent_pid


def _child_id() -> None:
    """Run in a fresh interpreter: a spawned child (as uvicorn's workers are) reports its server id."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        answer = pool.apply(group.server_id)
    print(os.getpid(), answer)


def test_the_folders_of_servers_that_are_gone_are_reaped() -> None:
    mine = group.shared_dir()
    (mine / "state.json").write_text("{}")
    gone = group.runtime_dir() / "server-999999999-1"  # no such pid
    gone.mkdir(exist_ok=True)
    (gone / "state.json").write_text("{}")
    assert gone in group.reap_shared_dirs()
    assert not gone.exists() and (mine / "state.json").is_file()


def test_a_process_is_alive_until_it_ends() -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert group.alive(os.getpid()) and not group.alive(int(gone.stdout))


def test_processes_given_one_listening_socket_are_one_server() -> None:
    """As gunicorn's forked workers, or `uvicorn --fd`: the socket they were handed names their server."""
    code = "from app.server import group; print(group.server_id())"
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        ids = {
            subprocess.run(
                [sys.executable, "-c", code], pass_fds=[listening.fileno()], capture_output=True, text=True, cwd=ROOT
            ).stdout.strip()
            for _ in range(2)
        }
        assert ids == {f"socket-{os.fstat(listening.fileno()).st_ino}"}
    alone = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT).stdout
    assert not alone.startswith("socket-")


@pytest.fixture
def configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """NORMSERVE_RUNTIME_DIR set to a folder not made yet."""
    folder = tmp_path / "runtime"
    monkeypatch.setenv("NORMSERVE_RUNTIME_DIR", str(folder))
    return folder


def test_the_runtime_folder_is_made_private_and_a_server_folder_in_it_too(configured: Path) -> None:
    assert group.runtime_dir() == configured
    shared = group.shared_dir()
    for folder in (configured, shared):
        st = folder.lstat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, os.geteuid())


OTHER_UID = 40002  # a uid no process of the test runs as


@pytest.mark.parametrize(
    ("how", "problem"),
    [
        ("mode 0777", "mode 0777, open to other users, not 0700"),
        ("mode 0750", "mode 0750, open to other users, not 0700"),
        ("another owner", f"owned by uid {OTHER_UID}, not by this server's uid {os.geteuid()}"),
        ("a link", "not a folder (a link or a file)"),
    ],
)
def test_a_runtime_folder_that_is_not_this_users_alone_is_refused_and_the_grpc_port_with_it(
    configured: Path, tmp_path: Path, how: str, problem: str
) -> None:
    """Another local user who made it first (in a shared temporary directory) could rewrite the workers' model state
    and hold the gRPC port's claim: the server refuses to start instead, naming the folder and the setting."""
    if how == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        configured.symlink_to(tmp_path / "elsewhere")
    else:
        configured.mkdir()
        configured.chmod(0o777 if how == "mode 0777" else 0o750 if how == "mode 0750" else 0o700)
        if how == "another owner":
            if os.geteuid() != 0:
                pytest.skip("giving a folder to another uid takes root")
            os.chown(configured, OTHER_UID, OTHER_UID)
    message = f"{configured}: {problem}; remove it, or set NORMSERVE_RUNTIME_DIR to a folder of this user's own"
    with pytest.raises(group.UnsafeFolder) as refused:
        group.shared_dir()
    assert str(refused.value) == message
    port = free_port()
    with pytest.raises(group.PortTaken) as taken:
        group.claim_grpc_port(port, owner="555-1")
    assert str(taken.value) == f"cannot claim gRPC port {port}: {message}"
    assert not (configured / f"grpc-{port}.owner").exists()  # nothing written in it
