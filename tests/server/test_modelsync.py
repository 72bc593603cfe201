"""app/server/modelsync.py: explicit model control with several workers, every worker serving what the API answered.

A real `normserve serve --workers 2` in explicit mode, where each probe opens a new connection, which the kernel
may give to either worker, so a worker left behind shows up as a second distinct answer; then one worker's side
in this process, its peers standing in as other processes' files in the shared folder.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.core.model import sha256_of
from app.core.repository import Policy
from app.core.runtime import Runtime
from app.errors import ModelLoadFailed
from app.server import group, modelsync
from app.server.control import ModelControl
from app.server.modelsync import ModelSync
from app.settings import Settings
from benchmarks.servers import Server
from tests.cli.normserve import NORMSERVE
from tests.live_server import cli_server
from tests.polling import wait_until
from tests.repositories import add_version, copy_models, learned_layernorm

TOKEN = "sync-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROBES = 24


def everywhere(base: str, method: str, path: str) -> set[tuple[int, str]]:
    """The distinct answers of PROBES requests, each on a new connection (so on any worker)."""
    seen = set()
    for _ in range(PROBES):
        r = httpx.request(method, base + path, headers=AUTH, timeout=30)
        seen.add((r.status_code, r.text))
    return seen


def versions(base: str, name: str) -> set[tuple[int, tuple[str, ...]]]:
    return {(s, tuple(json.loads(t).get("versions", ()))) for s, t in everywhere(base, "GET", f"/v2/models/{name}")}


def index(base: str) -> list[tuple[str, str, str, str]]:
    """The repository index, asserted the same on every worker."""
    answers = everywhere(base, "POST", "/v2/repository/index")
    assert len(answers) == 1, f"the index differs between workers: {answers}"
    (status, text) = answers.pop()
    assert status == 200
    return [(e["name"], e["version"], e["state"], e["reason"]) for e in json.loads(text)]


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # ended meanwhile
        return b""


def workers(server: Server, count: int) -> set[int]:
    """The pids of the server's workers (uvicorn's spawned children), once there are `count` (or 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
        found = {int(c) for c in children if b"spawn_main" in _cmdline(c)}
        if len(found) == count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def all_started(server: Server, count: int) -> None:
    """Until `count` workers have loaded their start-up models (each acknowledges in the server's shared folder,
    just before it reports ready), then until every one of them is ready: a server answers ready as soon as its
    first worker is, but its normserve_ready gauge is the least ready live worker's (each one's 0 from its start)."""
    folder = group.runtime_dir() / f"server-{server.pid}-{group.started_at(server.pid)}"
    deadline = time.monotonic() + 60
    while sum(json.loads(f.read_text())["generation"] >= 0 for f in folder.glob("worker-*.json")) < count:
        assert time.monotonic() < deadline, f"fewer than {count} workers started"
        time.sleep(0.05)
    wait_until(lambda: "\nnormserve_ready 1.0\n" in httpx.get(f"{server.base}/metrics").text, "every worker ready", 60)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = copy_models(tmp_path / "models", ("layernorm",))
    learned_layernorm(root, "ln", 1, np.ones(8, np.float32), np.zeros(8, np.float32))
    return root


def explicit_env(repository: Path, **settings: str) -> dict[str, str]:
    """The environment of a server of several workers in explicit mode with the admin token, NORMSERVE_* on top."""
    more = {f"NORMSERVE_{k.upper()}": v for k, v in settings.items()}
    return {
        **os.environ,
        "NORMSERVE_MODEL_DIR": str(repository),
        "NORMSERVE_MODEL_CONTROL": "explicit",
        "NORMSERVE_ADMIN_TOKEN": TOKEN,
        "NORMSERVE_LOG_LEVEL": "warning",
        **more,
    }


@pytest.fixture
def server(repository: Path) -> Iterator[Server]:
    env = explicit_env(repository)
    with cli_server([str(NORMSERVE), "serve", "--workers", "2"], env) as running:
        all_started(running, 2)
        yield running


def control(server: Server, action: str, name: str) -> httpx.Response:
    return httpx.post(f"{server.base}/v2/repository/models/{name}/{action}", headers=AUTH, timeout=120)


def test_a_load_and_an_unload_that_answered_are_served_by_every_worker(repository: Path, server: Server) -> None:
    add_version(repository, "ln", 2)
    r = control(server, "load", "ln")
    assert (r.status_code, r.json()) == (200, {"name": "ln", "loaded": ["2"], "serving": ["2"]})
    assert versions(server.base, "ln") == {(200, ("2",))}
    assert index(server.base) == [
        ("layernorm", "1", "READY", ""),
        ("ln", "1", "UNAVAILABLE", "not selected by the version_policy any more"),
        ("ln", "2", "READY", ""),
    ]
    r = control(server, "unload", "layernorm")
    assert (r.status_code, r.json()) == (200, {"name": "layernorm", "unloaded": ["1"]})
    assert {s for s, _ in everywhere(server.base, "GET", "/v2/models/layernorm")} == {404}
    assert index(server.base)[0] == ("layernorm", "1", "UNAVAILABLE", "unloaded")
    assert control(server, "load", "layernorm").status_code == 200
    assert versions(server.base, "layernorm") == {(200, ("1",))}


def test_a_failed_load_changes_nothing_on_any_worker_and_every_index_says_why(repository: Path, server: Server) -> None:
    broken = add_version(repository, "ln", 2) / "weights.npz"
    broken.write_bytes(b"not the weights")
    r = control(server, "load", "ln")
    listed = json.loads((broken.parent / "manifest.json").read_text())["files"]["weights.npz"]
    reason = f"{broken.relative_to(repository)}: sha256 {sha256_of(broken)} does not match the manifest's {listed}"
    assert (r.status_code, r.json()) == (400, {"error": f"failed to load model 'ln': {reason}"})
    assert versions(server.base, "ln") == {(200, ("1",))}
    assert index(server.base)[1:] == [("ln", "1", "READY", ""), ("ln", "2", "UNAVAILABLE", reason)]


def test_a_worker_started_later_serves_what_the_others_serve(repository: Path, server: Server) -> None:
    add_version(repository, "ln", 2)
    assert control(server, "load", "ln").status_code == 200
    assert control(server, "unload", "layernorm").status_code == 200
    before = index(server.base)
    victim = min(workers(server, 2))
    os.kill(victim, signal.SIGKILL)  # uvicorn starts a new worker in its place
    deadline = time.monotonic() + 60
    while victim in (replaced := workers(server, 2)) or len(replaced) != 2:  # until uvicorn has replaced it
        assert time.monotonic() < deadline, f"uvicorn did not replace worker {victim}: {replaced}"
        time.sleep(0.1)
    while (ready := {s for s, _ in everywhere(server.base, "GET", "/v2/health/ready")}) != {200}:
        assert time.monotonic() < deadline, f"the new worker never became ready ({ready})"
        time.sleep(0.2)
    assert versions(server.base, "ln") == {(200, ("2",))}
    assert {s for s, _ in everywhere(server.base, "GET", "/v2/models/layernorm")} == {404}
    assert index(server.base) == before
    add_version(repository, "ln", 3)  # the dead worker is not waited for; the new one applies the next load
    assert control(server, "load", "ln").json() == {"name": "ln", "loaded": ["3"], "serving": ["3"]}
    assert versions(server.base, "ln") == {(200, ("3",))}


# ---- one worker's side, in this process: peers are other pids' files in the shared folder ----------------------


def _sync(root: Path, folder: Path) -> ModelSync:
    control = ModelControl(Runtime(Settings(model_dir=root, model_control="explicit")))
    for name in control.startup_names():
        control.runtime.put_in_service(control.build(name))
    sync = ModelSync(control, folder)
    sync.started()
    return sync


def test_the_model_json_a_load_used_is_what_every_worker_serves_with(repository: Path, tmp_path: Path) -> None:
    """A changed model.json reloads the serving version everywhere; one changed on disk but not loaded does not
    reach a worker that applies another model's load."""
    first, second = _sync(repository, tmp_path), _sync(repository, tmp_path)
    loaded = {"version_policy": {"all": {}}, "dynamic_batching": {"max_batch_size": 1}}
    (repository / "ln/model.json").write_text(json.dumps(loaded))
    before = second.control.runtime.serving["ln"][1]
    first.run(lambda: first.control.load("ln"), "ln")
    second.catch_up()
    for sync in (first, second):
        assert sync.control.runtime.serving["ln"][1].policy == Policy(**loaded)
    assert second.control.runtime.serving["ln"][1] is not before
    (repository / "ln/model.json").write_text(json.dumps({"version_policy": {"latest": {"num_versions": 1}}}))
    first.run(lambda: first.control.load("layernorm"), "layernorm")
    second.catch_up()
    assert second.control.runtime.serving["ln"][1].policy == Policy(**loaded)


@pytest.fixture
def peer() -> Iterator[int]:
    """A live process that stands for another worker: its pid names an acknowledgement file."""
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as proc:
        try:
            yield proc.pid
        finally:
            proc.kill()


def _ack(folder: Path, pid: int, generation: int, error: str | None = None) -> None:
    (folder / f"worker-{pid}.json").write_text(json.dumps({"generation": generation, "error": error}))


def test_a_published_generation_is_applied_by_another_worker_with_its_index(repository: Path, tmp_path: Path) -> None:
    first, second = _sync(repository, tmp_path), _sync(repository, tmp_path)
    add_version(repository, "ln", 2)
    first.run(lambda: first.control.load("ln"), "ln")
    assert sorted(second.control.runtime.serving["ln"]) == [1]
    second.catch_up()
    assert sorted(second.control.runtime.serving["ln"]) == [2]
    assert second.control.runtime.index() == first.control.runtime.index()
    first.run(lambda: first.control.unload("ln"), "ln")
    second.catch_up()
    assert (
        "ln" not in second.control.runtime.serving and second.control.runtime.index() == first.control.runtime.index()
    )


def test_a_worker_that_does_not_apply_a_change_in_time_is_named(
    repository: Path, tmp_path: Path, peer: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync = _sync(repository, tmp_path)
    _ack(tmp_path, peer, 0)
    monkeypatch.setattr(modelsync, "APPLY_TIMEOUT_S", 0.3)
    with pytest.raises(ModelLoadFailed) as e:
        sync.run(lambda: sync.control.unload("ln"), "ln")
    assert str(e.value) == f"model 'ln': applied here, but worker(s) {peer} did not apply it within 0.3 s"


def test_a_worker_that_failed_to_apply_a_change_is_named_with_its_reason_and_the_change_rolled_back(
    repository: Path, tmp_path: Path, peer: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers converge on what they served before rather than serve different versions; the peer here is a
    file that never applies the roll-back either, which the answer says."""
    sync = _sync(repository, tmp_path)
    sync.run(lambda: sync.control.unload("layernorm"), "layernorm")  # generation 1, before the peer started
    add_version(repository, "ln", 2)
    _ack(tmp_path, peer, 2, "failed to load model 'ln': ln/2/model.onnx: no space left")
    monkeypatch.setattr(modelsync, "APPLY_TIMEOUT_S", 0.3)
    with pytest.raises(ModelLoadFailed) as e:
        sync.run(lambda: sync.control.load("ln"), "ln")
    assert str(e.value) == (
        f"model 'ln': worker {peer} could not apply it: failed to load model 'ln': ln/2/model.onnx: no space left; "
        f"rolling back failed too: model 'ln': applied here, but worker(s) {peer} did not apply it within 0.3 s"
    )
    assert sorted(sync.control.runtime.serving["ln"]) == [1]
    state = json.loads((tmp_path / "state.json").read_text())
    assert (state["generation"], state["serving"]) == (3, {"ln": [1]})
    _ack(tmp_path, peer, 4)  # the peer follows again: the next change goes through
    assert sync.run(lambda: sync.control.unload("ln"), "ln") == [1]


def test_a_worker_that_died_is_not_waited_for(repository: Path, tmp_path: Path) -> None:
    sync = _sync(repository, tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _ack(tmp_path, int(gone.stdout), 0)
    assert sync.run(lambda: sync.control.unload("ln"), "ln") == [1]
    assert not (tmp_path / f"worker-{gone.stdout.strip()}.json").exists()


def _shared_folder(server: Server) -> Path:
    return group.runtime_dir() / f"server-{server.pid}-{group.started_at(server.pid)}"


def _invalid(problem: str) -> dict[str, str]:
    return {
        "error": f"the workers' shared model state (state.json) is invalid: {problem}; no load or unload runs until "
        "the server restarts"
    }


@pytest.mark.parametrize(
    ("how", "problem"),
    [
        ("garbage", "not JSON"),
        ("a generation that is no number", "expected an object of generation, serving, policies and states"),
        ("a FIFO", "not a regular file"),
        ("a link", "a symbolic link"),
        ("a generation gone back", "its generation 1 is older than this worker's 2"),
    ],
)
def test_a_state_file_no_worker_wrote_is_refused_with_503_and_no_worker_changes(
    repository: Path, server: Server, how: str, problem: str
) -> None:
    """Applied, it unloaded every model, answered 500, made the workers diverge after a 200, or hung them (a FIFO)."""
    assert control(server, "unload", "ln").status_code == 200  # generation 1
    assert control(server, "load", "ln").status_code == 200  # generation 2
    state = _shared_folder(server) / "state.json"
    good = json.loads(state.read_text())
    state.unlink()
    if how == "garbage":
        state.write_text("garbage")
    elif how == "a generation that is no number":
        state.write_text(json.dumps({"generation": "x"}))
    elif how == "a FIFO":
        os.mkfifo(state)
    elif how == "a link":
        (state.parent / "elsewhere.json").write_text(json.dumps(good))
        state.symlink_to(state.parent / "elsewhere.json")
    else:
        state.write_text(json.dumps({**good, "generation": 1}))
    time.sleep(0.3)  # every worker's watcher has looked at it
    for action, name in (("unload", "layernorm"), ("load", "ln")):
        r = control(server, action, name)
        assert (r.status_code, r.json()) == (503, _invalid(problem))
    assert versions(server.base, "ln") == {(200, ("1",))}
    assert versions(server.base, "layernorm") == {(200, ("1",))}


def test_a_state_file_deleted_is_written_anew_past_every_workers_generation(repository: Path, server: Server) -> None:
    """It restarted at generation 1, which the workers at a higher one ignored: an unload answered 200 on one worker
    while the other served on."""
    for action in ("unload", "load", "unload", "load"):
        assert control(server, action, "ln").status_code == 200
    state = _shared_folder(server) / "state.json"
    state.unlink()
    assert control(server, "unload", "ln").status_code == 200
    assert json.loads(state.read_text())["generation"] == 5
    assert {s for s, _ in everywhere(server.base, "GET", "/v2/models/ln")} == {404}


def test_an_unload_sent_while_a_worker_still_loads_at_start_is_refused_there_and_every_worker_converges(
    tmp_path: Path,
) -> None:
    """A worker that ran it while still loading published a state its own start-up then overrode: layernorm
    UNAVAILABLE on one worker, READY on the other. The encoder makes start-up last seconds."""
    repository = copy_models(tmp_path / "models", ("layernorm", "encoder"))
    env = explicit_env(repository)
    starting = "cannot unload model 'layernorm' yet: this worker of the server is still loading its start-up models"
    answers = set()
    with cli_server([str(NORMSERVE), "serve", "--workers", "2"], env, ready="/v2/health/live") as running:
        deadline = time.monotonic() + 60
        while (r := control(running, "unload", "layernorm")).status_code != 200:
            answers.add((r.status_code, r.json()["error"]))
            assert time.monotonic() < deadline, answers
        all_started(running, 2)
        assert answers <= {(503, f"{starting}; retry")}
        assert {s for s, _ in everywhere(running.base, "GET", "/v2/models/layernorm")} == {404}
        assert index(running.base)[-1] == ("layernorm", "1", "UNAVAILABLE", "unloaded")


TRIES = 8


def test_files_changed_while_the_workers_load_never_leave_them_diverged_nor_quote_the_repositorys_path(
    repository: Path, server: Server
) -> None:
    """A version's model.onnx tampered with 0 to 120 ms after its load was sent: the worker that answers may load it
    before, and its peer after (the peer then fails), or both may see either file. Whatever each try answers, every
    worker serves the same versions after it, and no answer names the repository's absolute path: the peer's
    failure said it, and left the answering worker on the new version and the other on none."""
    rng = np.random.default_rng(37)
    seen = set()
    for version in range(2, 2 + TRIES):
        onnx = add_version(repository, "ln", version) / "model.onnx"
        with httpx.Client(timeout=120, headers=AUTH) as client:
            sent = client.build_request("POST", f"{server.base}/v2/repository/models/ln/load")
            pending = concurrent.futures.ThreadPoolExecutor(1).submit(client.send, sent)
            time.sleep(float(rng.uniform(0, 0.12)))
            onnx.write_bytes(onnx.read_bytes() + b"\0")
            r = pending.result()
        assert str(repository) not in r.text
        assert r.status_code in (200, 400), r.text
        outcome = "loaded" if r.status_code == 200 else "rolled back" if "rolled back" in r.text else "refused"
        seen.add(outcome)
        answers = versions(server.base, "ln")
        assert len(answers) == 1, f"try {version} ({outcome}: {r.text}): the workers diverged: {answers}"
    print(f"\n{TRIES} tries: {sorted(seen)}")
