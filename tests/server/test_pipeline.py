"""app/server/pipeline.py: a request's stages, each timed (Job), and where DataPlane.infer runs them."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from app.core.dataplane import EncodeInput, NormalizeInput, NormalizeOutput
from app.core.model import Model
from app.core.seeds import SEED003
from app.core.textbatching import Pooled
from app.core.textencoder import TextInput
from app.errors import InvalidInput
from app.server.api.rest import codec
from app.server.dataplane import INLINE_BODY_BYTES
from app.server.pipeline import Job, monitored
from app.server.telemetry.timer import STAGES, InferTimer
from app.server.worker import Worker
from app.settings import Settings
from tests.live_server import MODELS
from tests.server.stages import Stages


@pytest.fixture(scope="module")
def ready_worker() -> Worker:
    """A worker on the repo's models, with the default dynamic batching (the encoders have a batcher)."""
    worker = Worker(Settings(model_dir=MODELS))
    worker.lifecycle.start()
    assert worker.admission.ready, worker.admission.not_ready_reason
    return worker


def test_a_job_marks_the_four_stages_in_order_and_names_the_model(ready_worker: Worker) -> None:
    model = ready_worker.plane.model("layernorm")
    timer = InferTimer()

    def encode(wire: str, out: NormalizeOutput) -> tuple[str, tuple[int, ...]]:
        return wire, out.output.shape

    job = Job(
        timer,
        Stages(lambda _: (model, NormalizeInput(np.array(SEED003.x)), "wire"), encode),
        b"",
        model,
        ready_worker.plane.model,
    )
    assert timer.marks == {} and timer.model is None  # nothing runs before the job does
    assert job() == ("wire", (2, 3))  # encode gets what decode kept for it and the model's result
    assert list(timer.marks) == list(STAGES)
    assert [timer.marks[stage] for stage in STAGES] == sorted(timer.marks.values())
    assert timer.model == ("layernorm", "1")


@pytest.mark.parametrize(
    ("failing", "marked"),
    [
        ("decode", ["queue"]),
        ("infer", ["queue", "compute_input"]),
        ("encode", ["queue", "compute_input", "compute_infer"]),
    ],
)
def test_a_job_marks_only_the_stages_before_the_one_that_raised(
    ready_worker: Worker, failing: str, marked: list[str]
) -> None:
    model = ready_worker.plane.model("layernorm")
    huge = np.full(2, 3e38, np.float32)  # gamma and beta whose output overflows float32: the model refuses it
    x = np.array([[0.0, 1.0]])
    request = NormalizeInput(x, gamma=huge, beta=huge) if failing == "infer" else NormalizeInput(x)

    def decode(_: bytes) -> tuple[Model, NormalizeInput, None]:
        if failing == "decode":
            raise InvalidInput("not valid JSON", "body")
        return model, request, None

    def encode(_: None, out: NormalizeOutput) -> bytes:
        if failing == "encode":
            raise InvalidInput("cannot be encoded", "output")
        return codec.encode_normalize(out)

    timer = InferTimer()
    with pytest.raises(InvalidInput):
        Job(timer, Stages(decode, encode), b"", None, ready_worker.plane.model)()
    assert list(timer.marks) == marked
    assert timer.model == (None if failing == "decode" else ("layernorm", "1"))


def test_a_job_drops_its_body_once_decoded(ready_worker: Worker) -> None:
    model = ready_worker.plane.model("layernorm")
    seen: list[int] = []

    def decode(body: bytearray) -> tuple[Model, NormalizeInput, None]:
        seen.append(len(job._held))  # the body is the codec's alone while it decodes
        return model, NormalizeInput(np.array(SEED003.x)), None

    job = Job(InferTimer(), Stages(decode), bytearray(b"{}"), model, ready_worker.plane.model)
    job()
    assert seen == [0] and job._held == []


@pytest.mark.parametrize(
    ("name", "size", "decoded_on_the_loop", "inferred_on_the_loop"),
    [
        ("layernorm", INLINE_BODY_BYTES, True, True),
        ("encoder", INLINE_BODY_BYTES, True, False),  # a batcher blocks its caller while the batch gathers
        ("layernorm", INLINE_BODY_BYTES + 1, False, False),
    ],
    ids=["tiny", "tiny-batched", "large"],
)
def test_serve_decodes_a_tiny_body_on_the_event_loop_and_infers_there_unless_its_model_batches(
    ready_worker: Worker, name: str, size: int, decoded_on_the_loop: bool, inferred_on_the_loop: bool
) -> None:
    model = ready_worker.plane.model(name)
    x = np.array(SEED003.x) if name == "layernorm" else np.zeros((1, 2, 128), np.float32)
    request: Any = NormalizeInput(x) if name == "layernorm" else EncodeInput(x, None, model.limits)  # type: ignore[attr-defined]
    threads: dict[str, int] = {}

    def decode(_: bytes) -> tuple[Model, Any, None]:
        threads["decode"] = threading.get_ident()
        return model, request, None

    def encode(_: None, out: Any) -> str:
        threads["encode"] = threading.get_ident()
        return "answered"

    async def scenario() -> tuple[str, int]:
        answer = await ready_worker.plane.infer(Stages(decode, encode, model, size), b"")
        return answer, threading.get_ident()

    answer, loop = asyncio.run(scenario())
    assert answer == "answered" and ready_worker.admission.count() == 0
    assert (threads["decode"] == loop, threads["encode"] == loop) == (decoded_on_the_loop, inferred_on_the_loop)


class Ran(Stages):
    """Stages with a run of their own (/tokenize's codec runs the tokenizer): the Job calls it, not the model."""

    def run(self, model: Model, request: Any) -> tuple[str, str, Any]:
        return "ran", model.name, request


def test_a_codecs_run_takes_the_place_of_the_models_inference(ready_worker: Worker) -> None:
    model = ready_worker.plane.model("layernorm")
    timer = InferTimer()
    # no input the layernorm model takes: its inference would raise
    job = Job(
        timer, Ran(lambda _: (model, "texts", "wire"), lambda w, out: (w, out)), b"", model, ready_worker.plane.model
    )
    assert job() == ("wire", ("ran", "layernorm", "texts"))
    assert list(timer.marks) == list(STAGES)


def test_a_text_encoders_tiny_request_runs_off_the_event_loop(tiny_bert: Any) -> None:
    """Its pool may hold the caller while concurrent requests gather: on the event loop none could arrive."""
    from app.core.dataplane import Fields

    worker = Worker(Settings(model_dir=tiny_bert.path.parents[2]))
    worker.lifecycle.start()
    model = worker.plane.model("bert")
    request = model.from_tensors({"text": np.array(["a b"], dtype=object)}, {}, Fields())
    threads: dict[str, int] = {}

    def encode(_: None, out: Any) -> Any:
        threads["encode"] = threading.get_ident()
        return out.sentence_embedding

    async def scenario() -> tuple[Any, int]:
        answer = await worker.plane.infer(Stages(lambda _: (model, request, None), encode, model, 0), b"")
        return answer, threading.get_ident()

    answer, loop = asyncio.run(scenario())
    assert answer.shape == (1, tiny_bert.config.hidden_size) and worker.admission.count() == 0
    assert threads["encode"] != loop


@pytest.mark.parametrize("asked", [False, True], ids=["not-asked", "asked"])
def test_a_pooled_text_keeps_its_statistics_for_the_monitor_whatever_the_client_asked(asked: bool) -> None:
    ids = np.array([[2, 7, 9, 3], [2, 8, 3, 0]])
    request = Pooled(ids, (ids != 0).astype(np.int64), None, layer_norms=asked)
    got = monitored(request)
    assert isinstance(got, Pooled) and got.layer_norms is True
    assert np.array_equal(got.input_ids, ids) and np.array_equal(got.attention_mask, request.attention_mask)
    assert request.layer_norms is asked  # the codec reads the client's choice from its own copy


@pytest.mark.parametrize(
    "request_",
    [NormalizeInput(np.ones((2, 3), np.float32)), TextInput(np.array([[2, 3]]), np.array([[1, 1]]))],
    ids=["normalize", "text-as-sent"],
)
def test_other_requests_go_to_the_monitor_as_they_are(request_: Any) -> None:
    assert monitored(request_) is request_
