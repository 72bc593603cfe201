"""What every model kind is: its ONNX signature, its V2 tensors, its feeds, its warm-up; one class per kind.

This module and the kinds (app/core/layernorm.py, app/core/encoder.py) are the contract between
the exporter, which writes graphs with exactly these signatures (app/export/), and the server,
which loads them (app/core/runtime.py): no torch here. Adding a kind means adding one subclass
and naming it in `app.core.runtime.KINDS`.
"""

from __future__ import annotations

import functools
import hashlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnxruntime as ort

from app.core.batching import Batcher
from app.core.dataplane import Fields, ModelInfo
from app.core.modelmonitor import ModelMonitor
from app.core.repository import WEIGHTS_FILE, Policy
from app.errors import InvalidInput, shown
from app.settings import Settings

# (name, shape) in graph order; a str dim is a named dynamic axis, an int a fixed size.
Signature = list[tuple[str, list[str | int]]]
# Told of every onnxruntime run: (model, version, seconds, rows in the batch, whether it is the load's warm-up).
RunObserver = Callable[[str, str, float, int, bool], None]
# Accepted for float inputs and outputs: FP64 is cast once to float32, FP16 and BF16 widened exactly (and an
# output in them rounded once, app/core/halfprecision.py). Metadata reports the first.
FLOAT = ("FP32", "FP64", "FP16", "BF16")
# A statistic (mean, inv_std_dev, an encoder's per-LayerNorm ones) of an FP16 or BF16 input is answered in FP32, as
# onnxruntime's LayerNormalization types its Mean and InvStdDev (stash_type): in FP16 an inv_std_dev over 65504
# (eps=1e-12 on a constant row: 1e6) was refused, and the `output` of the same request fits.
STATISTICS_OF_HALF = "FP32"
PLATFORM = "onnxruntime_onnx"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as V2 model metadata reports it; -1 is a dim of any size."""

    name: str
    datatypes: tuple[str, ...]  # accepted on input; metadata reports the first
    shape: tuple[int, ...]
    optional: bool = False
    statistic: bool = False  # an output in STATISTICS_OF_HALF for a half-precision input, unless another is asked

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatypes[0], "shape": list(self.shape)}


class ModelLoadError(RuntimeError):
    """A model file that is missing, does not match its sha256, or fails its parity warm-up."""


@dataclass(frozen=True)
class Loaded:
    """What the runtime hands a kind: the manifest's entry, the verified file and its session."""

    entry: Mapping[str, Any]
    path: Path
    session: ort.InferenceSession
    settings: Settings
    observe: RunObserver
    in_flight: Callable[[], int] | None = None  # requests in this worker: a batch stops waiting when all are in
    policy: Policy | None = None  # the model's model.json: dynamic batching overrides the server's settings


def positive_int(config: Mapping[str, Any], key: str, where: Path) -> int:
    """A config field that sizes the model: ModelLoadError naming the manifest and the field unless it is >= 1."""
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelLoadError(f"{where}: config.{key} {shown(value)}; expected a positive integer")
    return value


def positive_float(config: Mapping[str, Any], key: str, where: Path, default: float) -> float:
    """An eps: finite and > 0, or ModelLoadError naming the field."""
    value = config.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < float("inf"):
        raise ModelLoadError(f"{where}: config.{key} {shown(value)}; expected a positive finite number")
    return float(value)


def read_weights(loaded: Loaded, dtype: type[np.floating[Any]] = np.float64) -> dict[str, np.ndarray]:
    """weights.npz as float64 (or dtype) arrays; it must be listed in the manifest's files, so that its sha256 was
    checked."""
    path = loaded.path.parent / WEIGHTS_FILE
    if WEIGHTS_FILE not in loaded.entry.get("files", {}):
        raise ModelLoadError(f"{path}: not listed in the manifest's files, so its sha256 cannot be checked")
    try:
        with np.load(path, allow_pickle=False) as npz:  # no pickle: weights are plain arrays
            return {k: npz[k].astype(dtype) for k in npz.files}
    except Exception as e:  # a zip that is not one, an array that is not numbers, a missing file
        raise ModelLoadError(f"{path}: unreadable weights ({describe(e)})") from None


def describe(error: BaseException) -> str:
    """An unexpected error while loading, for a reason in the index: its class and its first 300 characters."""
    if isinstance(error, RecursionError):
        return "nested too deeply"
    text = str(error).strip()
    text = text if len(text) <= 300 else text[:299] + "…"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def shown_signature(signature: Signature) -> str:
    return ", ".join(f"{name}[{','.join(map(str, dims))}]" for name, dims in signature)


def graph_signature(args: list[Any]) -> Signature:
    """onnxruntime's NodeArgs as a Signature: a dynamic dim is its name (or "?" when it has none)."""
    return [(a.name, [d if isinstance(d, int) else (d or "?") for d in a.shape]) for a in args]


def _fits(graph: Signature, expected: Signature) -> bool:
    """Same names in the same order, each fixed dim equal and each dynamic one dynamic (its name may differ)."""
    if [n for n, _ in graph] != [n for n, _ in expected]:
        return False
    for (_, got), (_, want) in zip(graph, expected, strict=True):
        if len(got) != len(want):
            return False
        for g, w in zip(got, want, strict=True):
            if isinstance(w, int) != isinstance(g, int) or (isinstance(w, int) and g != w):
                return False
    return True


def check_graph(model: Model, manifest: Mapping[str, Any], where: Path) -> None:
    """The session's inputs and outputs are what the kind and its config expect, and what the manifest lists:
    a manifest that disagrees with its graph (another d_model, another list of LayerNorms) would otherwise
    load, and turn requests into onnxruntime errors."""
    graph_in, graph_out = graph_signature(model.session.get_inputs()), graph_signature(model.session.get_outputs())
    want_in, want_out = model.graph
    for side, got, want in (("inputs", graph_in, want_in), ("outputs", graph_out, want_out)):
        if not _fits(got, want):
            raise ModelLoadError(
                f"{where}: the graph's {side} are {shown_signature(got)}; the {model.kind} kind with this config "
                f"expects {shown_signature(want)}"
            )
        listed = manifest.get(side)
        if listed is not None and _names_and_shapes(listed) != [
            {"name": n, "shape": [d if isinstance(d, int) else -1 for d in dims]} for n, dims in got
        ]:
            raise ModelLoadError(f"{where}: {side} {shown(listed)} do not match the graph's {shown_signature(got)}")


def _names_and_shapes(listed: Any) -> Any:
    """The manifest's inputs or outputs without their datatypes: what the session's signature can be held to."""
    if not isinstance(listed, list):
        return listed
    return [{"name": t.get("name"), "shape": t.get("shape")} if isinstance(t, dict) else t for t in listed]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def version_sha256(files: Mapping[str, str]) -> str:
    """The identity a version answers with: the sha256 of `sha256sum`'s lines for every file of the version.

    Over every file, not model.onnx alone: trained LayerNorms share the default graph and differ only in
    weights.npz. Over the files' sha256s, not manifest.json: a re-export of the same files on another
    machine records other parity figures and library versions but computes the same thing. In a version
    folder, `sha256sum model.onnx weights.npz | sha256sum` (files in name order) prints the same digest.
    """
    lines = "".join(f"{files[name]}  {name}\n" for name in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def verify(path: Path, expected: str) -> None:
    """ModelLoadError unless the file is there with the manifest's sha256."""
    if not path.is_file():
        raise ModelLoadError(f"{path}: model file missing")
    actual = sha256_of(path)
    if actual != expected:
        raise ModelLoadError(f"{path}: sha256 {actual} does not match the manifest's {expected}")


class Model(ABC):
    """One loaded model version: a session built once, run by every request thread (onnxruntime is thread-safe)."""

    kind: ClassVar[str]
    inputs: tuple[TensorSpec, ...]  # the V2 view, built once at load
    outputs: tuple[TensorSpec, ...]
    parameters: ClassVar[tuple[str, ...]] = ()  # V2 request parameters the model reads
    numbers: ClassVar[Mapping[str, type[int] | type[float]]] = {}  # those of them that are numbers, and which kind
    graph: tuple[Signature, Signature]  # the session's inputs and outputs that this kind and its config expect
    # Merges concurrent requests into one run (app/core/batching.py); its callers block while a batch gathers.
    batcher: Batcher | None = None

    def __init__(self, loaded: Loaded) -> None:
        entry = loaded.entry
        self.info = ModelInfo(str(entry["name"]), str(entry.get("version", "1")), str(entry["sha256"]))
        self.files: dict[str, str] = dict(entry.get("files", {}))  # every file of the version: its sha256
        self.path = loaded.path
        self.session = loaded.session
        self.parity: dict[str, Any] = dict(entry.get("parity", {}))
        self.load_seconds = 0.0
        self.warming = False  # while the runtime runs its parity warm-up: no client's runs (Triton's statistics)
        self.policy = loaded.policy  # model.json as this version was built with it: its batching is built in
        self._observe = loaded.observe
        # The drift monitor of this version (app/core/monitor.py), built with it: "no baseline" for old exports.
        self.monitor = ModelMonitor(self.name, self.version, entry.get("baseline"), loaded.settings.monitor_window_s)
        self.monitor_sample = loaded.settings.monitor_sample

    @property
    def blocks(self) -> bool:
        """Whether a run may block its caller while concurrent requests gather (a batcher): the data plane then
        never runs it on the event loop, where nothing else could arrive to join it."""
        return self.batcher is not None

    @property
    def version_policy(self) -> dict[str, Any] | None:
        """model.json's version_policy, which the config reports."""
        return self.policy.version_policy if self.policy is not None else None

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def version(self) -> str:
        return self.info.version

    @property
    def sha256(self) -> str:
        return self.info.sha256

    def run(
        self, feeds: Mapping[str, np.ndarray], outputs: list[str] | None = None, options: ort.RunOptions | None = None
    ) -> list[np.ndarray]:
        """One onnxruntime run, merged batches included: each is observed (metrics, Triton's execution count)."""
        start = time.perf_counter()
        result: list[np.ndarray] = self.session.run(outputs, dict(feeds), options)
        rows = len(next(iter(feeds.values())))  # every kind feeds its batched input first (input, input_ids)
        self._observe(self.name, self.version, time.perf_counter() - start, rows, self.warming)
        return result

    @functools.cached_property
    def metadata(self) -> dict[str, Any]:
        """V2 model metadata (GET /v2/models/{name}), built once."""
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": PLATFORM,
            "inputs": [t.metadata() for t in self.inputs],
            "outputs": [t.metadata() for t in self.outputs],
        }

    def close(self) -> None:  # noqa: B027 - most kinds run nothing besides requests
        """The version is retired: stop what it runs besides requests (a batcher). Requests holding it finish."""

    def check_tensors(self, tensors: Mapping[str, np.ndarray], f: Fields) -> None:
        """Every required V2 input is there (the codec has refused unknown names and datatypes)."""
        for spec in self.inputs:
            if not spec.optional and spec.name not in tensors:
                raise InvalidInput(f"required input missing for model {self.name!r}", f"inputs.{spec.name}")

    @abstractmethod
    def from_tensors(
        self, tensors: Mapping[str, np.ndarray], params: Mapping[str, Any], f: Fields, dtype: str = "FP32"
    ) -> Any:
        """The data plane's input from V2 tensors and parameters (HTTP and gRPC alike); dtype: its output's."""

    @abstractmethod
    def infer(self, request: Any) -> Any:
        """The data plane: this kind's input in, its output out."""

    @abstractmethod
    def to_tensors(self, result: Any) -> dict[str, np.ndarray]:
        """Every V2 output by name, float32 or float64 (the codec casts to the wire datatype)."""

    @abstractmethod
    def warm_up(self) -> tuple[float, float]:
        """Run on fixed inputs against the NumPy reference: (max abs diff, its tolerance)."""
