"""Dynamic batching: batched == unbatched == reference under concurrent requests, and errors stay per request."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest

from app.core import reference
from app.core.batching import Batcher
from tests.live_server import live_server

BATCH_ENV = {"NORMSERVE_BATCH_MAX_SIZE": "8", "NORMSERVE_BATCH_DELAY_US": "2000"}
SAME_AS_UNBATCHED = 1e-6  # the same kernels on the same rows; only a different blocking could change a bit
REFERENCE_ATOL = 1e-4  # float32 graph vs float64 NumPy, as the encoder's parity promise


@pytest.fixture(scope="module")
def batched_server() -> Iterator[str]:
    with live_server(BATCH_ENV) as base:
        yield base


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The unbatched answer to compare with: batching off (it is on by default for short sequences)."""
    with live_server({"NORMSERVE_BATCH_MAX_SIZE": "1"}) as base:
        yield base


def _case(seed: int, batch: int, seq: int, model: str, masked: bool) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, seq, 128)).astype(np.float32)
    body: dict[str, Any] = {"data": x.tolist(), "model": model}
    if masked:
        mask = np.zeros((batch, seq), dtype=bool)
        mask[:, seq - 1 - seed % 3 :] = True  # a few padded positions at the end of every row
        body["padding_mask"] = mask.tolist()
    return body


# Mixed sequence lengths, batch sizes, masks and both models, all in flight at once.
CASES = [
    _case(seed, batch, seq, model, masked)
    for seed, (batch, seq, model, masked) in enumerate(
        [
            (1, 16, "encoder", False),
            (1, 16, "encoder", True),
            (2, 16, "encoder", False),
            (1, 9, "encoder", True),
            (1, 9, "encoder", False),
            (3, 16, "encoder", True),
            (1, 16, "encoder-preln", False),
            (2, 9, "encoder-preln", True),
            (1, 16, "encoder", False),
            (1, 33, "encoder", False),
            (1, 80, "encoder", True),  # longer than NORMSERVE_BATCH_MAX_SEQ_LEN (64): runs alone
            (2, 80, "encoder-preln", False),
            (1, 16, "encoder", True),
            (1, 9, "encoder", False),
        ]
    )
]


def _post_all(base: str, path: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """Every body at once, each from its own thread and connection, released together."""
    gate = threading.Barrier(len(bodies))

    def post(body: dict[str, Any]) -> httpx.Response:
        with httpx.Client(base_url=base, timeout=60) as c:
            gate.wait()
            return c.post(path, json=body)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))


def _weights(runtime: Any, name: str) -> tuple[dict[str, np.ndarray], Any]:
    model = runtime.get(name)
    return model.weights, model.config


@pytest.mark.parametrize("rounds", [3])
def test_concurrent_batched_encode_equals_unbatched_and_reference(
    batched_server: str, server: str, runtime: Any, rounds: int
) -> None:
    runs_before = _encoder_runs(batched_server)
    for _ in range(rounds):
        batched = _post_all(batched_server, "/encode", CASES)
        assert [r.status_code for r in batched] == [200] * len(CASES), [r.text[:200] for r in batched]
        for body, got in zip(CASES, batched, strict=True):
            unbatched = httpx.post(server + "/encode", json=body, timeout=60)
            assert unbatched.status_code == 200
            out, want = np.asarray(got.json()["output"]), np.asarray(unbatched.json()["output"])
            np.testing.assert_allclose(out, want, rtol=0, atol=SAME_AS_UNBATCHED)
            for a, b in zip(got.json()["layer_norms"], unbatched.json()["layer_norms"], strict=True):
                np.testing.assert_allclose(a["mean"], b["mean"], rtol=0, atol=SAME_AS_UNBATCHED)
                np.testing.assert_allclose(a["std"], b["std"], rtol=0, atol=SAME_AS_UNBATCHED)
            weights, cfg = _weights(runtime, body["model"])
            mask = np.asarray(body["padding_mask"]) if "padding_mask" in body else None
            ref, _ = reference.encoder(np.asarray(body["data"], np.float32), weights, cfg, mask)
            np.testing.assert_allclose(out, ref, rtol=0, atol=REFERENCE_ATOL)
    sent = rounds * sum(1 for body in CASES if body["model"] == "encoder")
    assert _encoder_runs(batched_server) - runs_before < sent  # some requests shared a run


def _encoder_runs(base: str) -> float:
    """onnxruntime runs of `encoder` so far, from the batch-size histogram of GET /metrics."""
    prefix = 'normserve_inference_batch_size_count{model="encoder",version="1"}'
    text = httpx.get(base + "/metrics", timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.parametrize(
    ("bad", "status", "message"),
    [
        (  # fails after the merged run, alone
            {"data": [[[1e38, -1e38] * 64] * 16]},
            422,
            "layers.0.norm1.mean: the result is not finite in FP32 (it overflows); scale the input down",
        ),
        (  # fails before it reaches the batcher
            {"data": [[[0.5] * 64] * 16]},
            422,
            "data: last dimension is 64, expected d_model = 128 (model 'encoder', version 1)",
        ),
        (
            {"data": [[[0.5] * 128] * 16], "padding_mask": [[False] * 15]},
            422,
            "padding_mask: shape [1, 15] does not match data's [batch, seq] = [1, 16]",
        ),
    ],
    ids=["overflow-inside-batch", "wrong-d-model", "mask-shape"],
)
def test_an_error_in_one_request_leaves_the_rest_of_its_batch_intact(
    batched_server: str, server: str, bad: dict[str, Any], status: int, message: str
) -> None:
    good = [CASES[0], CASES[2], CASES[8], CASES[10]]  # all seq 16, the same key as the bad one
    responses = _post_all(batched_server, "/encode", [*good[:2], bad, *good[2:]])
    assert responses[2].status_code == status
    assert responses[2].json()["error"] == message
    for body, got in zip(good, [*responses[:2], *responses[3:]], strict=True):
        assert got.status_code == 200, got.text[:200]
        want = httpx.post(server + "/encode", json=body, timeout=60).json()["output"]
        np.testing.assert_allclose(got.json()["output"], want, rtol=0, atol=SAME_AS_UNBATCHED)


@pytest.mark.parametrize("model", ["encoder", "encoder-preln"])
def test_concurrent_v2_infer_on_an_encoder_is_batched_like_encode(batched_server: str, server: str, model: str) -> None:
    bodies = []
    for seed in range(6):
        x = np.random.default_rng(100 + seed).standard_normal((1, 12, 128)).astype(np.float32)
        bodies.append(
            {"inputs": [{"name": "input", "shape": [1, 12, 128], "datatype": "FP32", "data": x.ravel().tolist()}]}
        )
    path = f"/v2/models/{model}/infer"
    for body, got in zip(bodies, _post_all(batched_server, path, bodies), strict=True):
        assert got.status_code == 200, got.text[:200]
        want = httpx.post(server + path, json=body, timeout=60).json()
        for a, b in zip(got.json()["outputs"], want["outputs"], strict=True):
            assert a["name"] == b["name"] and a["shape"] == b["shape"]
            np.testing.assert_allclose(a["data"], b["data"], rtol=0, atol=SAME_AS_UNBATCHED)


# ---- the Batcher itself, on the real encoder session ------------------------------------------


def _recording(runtime: Any, name: str) -> tuple[Any, list[int]]:
    """The model's own run, noting the batch size of every session call."""
    model = runtime.get(name)
    sizes: list[int] = []

    def run(feeds: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
        sizes.append(len(feeds["input"]))
        return model.run(feeds, names)  # type: ignore[no-any-return]

    return run, sizes


def _names(runtime: Any, name: str) -> list[str]:
    return ["output"] + [f"{n}.{s}" for n in runtime.get(name).layer_norms for s in ("mean", "std")]


@pytest.mark.parametrize(("max_size", "callers", "seqs"), [(8, 8, [10]), (4, 8, [10]), (8, 9, [10, 7, 3])])
def test_batcher_merges_concurrent_calls_up_to_max_size_by_sequence_length(
    runtime: Any, max_size: int, callers: int, seqs: list[int]
) -> None:
    run, sizes = _recording(runtime, "encoder")
    batcher = Batcher(run, max_size, delay_us=200_000, in_flight=lambda: callers, name="test")
    names = _names(runtime, "encoder")
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1, seqs[i % len(seqs)], 128)).astype(np.float32) for i in range(callers)]
    masks = [np.zeros(x.shape[:2], dtype=bool) for x in xs]
    gate = threading.Barrier(callers)

    def call(i: int) -> list[np.ndarray]:
        gate.wait()
        return batcher.run(xs[i], masks[i], names)

    with ThreadPoolExecutor(callers) as pool:
        results = list(pool.map(call, range(callers)))
    assert sum(sizes) == callers and max(sizes) <= max_size
    assert len(sizes) < callers  # at least one session call served several requests
    for x, mask, got in zip(xs, masks, results, strict=True):
        want = runtime.get("encoder").run({"input": x, "padding_mask": mask}, names)
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=0, atol=SAME_AS_UNBATCHED)


@pytest.mark.parametrize(("max_seq_len", "seq", "merged"), [(8, 10, False), (16, 10, True)])
def test_batcher_merges_only_sequences_up_to_max_seq_len(
    runtime: Any, max_seq_len: int, seq: int, merged: bool
) -> None:
    run, sizes = _recording(runtime, "encoder")
    batcher = Batcher(run, 8, delay_us=200_000, in_flight=lambda: 4, name="test", max_seq_len=max_seq_len)
    names = _names(runtime, "encoder")
    x = np.random.default_rng(3).standard_normal((1, seq, 128)).astype(np.float32)
    gate = threading.Barrier(4)

    def call(_: int) -> list[np.ndarray]:
        gate.wait()
        return batcher.run(x, np.zeros((1, seq), bool), names)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(call, range(4)))
    assert (max(sizes) > 1) == merged and sum(sizes) == 4
    for got in results:
        np.testing.assert_array_equal(got[0], results[0][0])


@pytest.mark.parametrize("in_flight", [1])
def test_batcher_does_not_wait_for_the_delay_when_no_other_request_is_in_flight(runtime: Any, in_flight: int) -> None:
    run, sizes = _recording(runtime, "encoder")
    batcher = Batcher(run, 8, delay_us=5_000_000, in_flight=lambda: in_flight, name="test")
    x = np.zeros((1, 4, 128), np.float32)
    start = time.monotonic()
    batcher.run(x, np.zeros((1, 4), bool), _names(runtime, "encoder"))
    assert time.monotonic() - start < 2.5  # far below the 5 s delay: it ran at once
    assert sizes == [1]
