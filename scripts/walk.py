"""The walk of one request through the code: the app's files in the order control visits them, and the climbs.

Serves the repo's models in this process (uvicorn, HTTP and gRPC, as `normserve serve` runs them), sends
one /normalize, one V2 binary infer and one gRPC infer (each once before, to warm up), and profiles the
server's threads (the event loop and the threadpool) while each runs. A stay is a run of profiler events
(calls, returns, a coroutine's resumptions) in one file; a climb is a call from a module into one that
imports it, directly or not, and is not imported by it: a callback into a higher layer, such as a codec
calling a route's closure (a coroutine resumed is no call).

    python scripts/walk.py                   # this checkout
    python scripts/walk.py --root ../before  # another checkout, e.g. before a change
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parents[1]


@dataclass
class Walk:
    """What the profiler saw of one request: the files in order, and each climb (caller -> callee)."""

    app: Path
    above: dict[str, set[str]]  # module file -> the files that import it, directly or not
    on: bool = False
    files: list[str] = field(default_factory=list)
    climbs: list[str] = field(default_factory=list)
    entered: dict[int, FrameType] = field(default_factory=dict)  # held: a resumed coroutine is no new call

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event not in ("call", "return"):
            return
        here = self._file(frame)
        if event == "return":
            here = self._file(frame.f_back) if frame.f_back is not None else None
        elif here is not None:
            self._climb(frame, here)
        if here is not None and (not self.files or self.files[-1] != here):
            self.files.append(here)

    def _climb(self, frame: FrameType, here: str) -> None:
        if id(frame) in self.entered:
            return
        self.entered[id(frame)] = frame
        caller = self._caller(frame)
        if caller is None or caller == here:
            return
        if here in self.above.get(caller, set()) and caller not in self.above.get(here, set()):
            self.climbs.append(f"{caller} -> {here}:{frame.f_code.co_name}")

    def _file(self, frame: FrameType | None) -> str | None:
        name = frame.f_code.co_filename if frame is not None else ""
        return name[len(str(self.app.parent)) + 1 :] if name.startswith(str(self.app) + "/") else None

    def _caller(self, frame: FrameType) -> str | None:
        back = frame.f_back
        while back is not None and self._file(back) is None:
            back = back.f_back
        return self._file(back)


def imports(path: Path, app: Path) -> set[Path]:
    """The app's files that one file imports (at any level: a function's import is a dependency too)."""
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for name in names:
            if name == "app" or not name.startswith("app."):
                continue
            base = app.parent.joinpath(*name.split("."))
            found.update(p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file())
    return found


def importers(app: Path) -> dict[str, set[str]]:
    """Each file of the app -> every file that imports it, directly or through others."""
    direct = {path: imports(path, app) for path in app.rglob("*.py")}
    above: dict[str, set[str]] = {}
    for start in direct:
        seen: set[Path] = set()
        todo = [start]
        while todo:
            for dep in direct.get(todo.pop(), set()) - seen:
                seen.add(dep)
                todo.append(dep)
        for dep in seen:
            above.setdefault(str(dep.relative_to(app.parent)), set()).add(str(start.relative_to(app.parent)))
    return above


@contextmanager
def serving(root: Path, walk: Walk) -> Iterator[tuple[int, int]]:
    """The app on free ports in a thread of this process, profiled by `walk` (off until a request starts)."""
    import uvicorn

    from app.server.app import create_app
    from app.settings import Settings
    from benchmarks.servers import free_port

    port, grpc_port = free_port(), free_port()
    settings = Settings(model_dir=root / "models", grpc_port=grpc_port, host="127.0.0.1", log_level="warning")
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, loop="uvloop", http="httptools")
    config.log_level = "warning"
    server = uvicorn.Server(config)
    threading.setprofile(walk.hook)  # every thread started from here on: the server's and its threadpool's
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        _wait_ready(port)
        yield port, grpc_port
    finally:
        server.should_exit = True
        thread.join(30)
        threading.setprofile(None)


def _wait_ready(port: int) -> None:
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not become ready within 120 s")


def requests(port: int, grpc_port: int) -> dict[str, Callable[[], None]]:
    """One small request of each kind, on connections opened once (the walk is the request's, not the connection's)."""
    import httpx
    import tritonclient.grpc as grpcclient

    from app.core.seeds import SEED003

    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    triton = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    x = np.asarray(SEED003.x, np.float32)
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
    head = json.dumps({"inputs": [tensor]}).encode()

    def normalize() -> None:
        assert http.post("/normalize", json={"data": SEED003.x}).status_code == 200

    def v2binary() -> None:
        headers = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
        r = http.post("/v2/models/layernorm/infer", content=head + x.tobytes(), headers=headers)
        assert r.status_code == 200

    def grpc() -> None:
        inp = grpcclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        triton.infer("layernorm", [inp])

    return {"POST /normalize": normalize, "V2 binary infer": v2binary, "gRPC ModelInfer": grpc}


def trace(walk: Walk, send: Callable[[], None]) -> tuple[list[str], list[str]]:
    """The files and climbs of one request, once the same request has warmed every lazy path up."""
    send()
    walk.files, walk.climbs, walk.entered = [], [], {}
    walk.on = True
    send()
    time.sleep(0.5)  # what the server does once the answer is out (the log line, metrics) belongs to the request
    walk.on = False
    walk.entered = {}
    return walk.files, walk.climbs


def report(name: str, files: list[str], climbs: list[str]) -> dict[str, Any]:
    """Print the walk: each file at its first visit with its number of stays, then the climbs."""
    stays: dict[str, int] = {}
    for f in files:
        stays[f] = stays.get(f, 0) + 1
    print(f"{name}: {len(stays)} files, {len(files)} stays, {len(climbs)} climbs back up")
    for i, (f, n) in enumerate(stays.items(), 1):
        print(f"  {i:2d}. {f} ({n})")
    for climb in climbs:
        print(f"  climb: {climb}")
    return {"files": len(stays), "stays": len(files), "climbs": len(climbs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, default=HERE, help="the checkout to walk (default: this one)")
    root = parser.parse_args().root.resolve()
    sys.path.insert(0, str(root))
    walk = Walk(root / "app", importers(root / "app"))
    summary = {}
    with serving(root, walk) as (port, grpc_port):
        for name, send in requests(port, grpc_port).items():
            summary[name] = report(name, *trace(walk, send))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
