"""Running a text encoder's texts, of one request or of concurrent ones, in groups of similar length under a budget.

A padded batch costs every text the longest text's length: one 256-token text among 255 short ones pads all of
them to 256, and attention's memory grows with batch x heads x seq x seq (256 texts of 256 tokens on
all-MiniLM-L6-v2: 12 x 256 x 256 x 4 bytes per text, 805 MB in one run). So texts are sorted by length and cut into
groups whose padded size (texts x longest) stays within NORMSERVE_TEXT_BATCH_TOKENS, each padded only to its own
longest text. A text's answer does not depend on its group: attention is within a text, padding is masked.

Concurrent requests pool their texts as app/core/batching.py's Batcher pools encoder rows: the callers block, one
thread per model version gathers what is queued until NORMSERVE_BATCH_DELAY_US has passed or every request in
flight is in, groups the texts of all of them, and hands each caller its own rows; a request alone in the worker
runs in its own thread without the hand-off, and a failed pooled run is retried per request, so that only its own
error reaches a caller. The thread ends once idle, so a retired version leaves none behind.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.core.dataplane import Fields
from app.core.model import Loaded, TensorSpec
from app.core.textencoder import TextEncoderModel, TextInput, TextOutput
from app.errors import InvalidInput

Stats = list[tuple[str, np.ndarray, np.ndarray]]  # (LayerNorm, mean, std) over one text's own tokens
TEXT = "text"  # the Open Inference Protocol's BYTES input of texts
IDLE_S = 1.0  # a batching thread with nothing queued this long ends (the next request starts another)


def length_groups(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of the texts, shortest first, cut into groups of at most `budget` padded tokens (a text longer
    than the budget runs alone)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[i] <= budget:  # sorted: this text is the group's longest
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def stack(rows: Sequence[tuple[TextInput, int]], pad_id: int, hidden_states: bool = False) -> TextInput:
    """Rows of right-padded batches (each a batch and a row index) as one batch padded to their own longest."""
    lengths = [int(req.attention_mask[i].sum()) for req, i in rows]
    width = max(lengths)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    types = None if rows[0][0].token_type_ids is None else np.zeros((len(rows), width), dtype=np.int64)
    for j, ((req, i), n) in enumerate(zip(rows, lengths, strict=True)):
        ids[j, :n], mask[j, :n] = req.input_ids[i, :n], req.attention_mask[i, :n]
        if types is not None and req.token_type_ids is not None:
            types[j, :n] = req.token_type_ids[i, :n]
    return TextInput(ids, mask, types, hidden_states)


@dataclass(eq=False)
class Rows:
    """One request's answer, filled group by group: each text's own rows, whatever it was grouped with."""

    request: TextInput
    embeddings: np.ndarray  # B,C
    stats: list[Stats]  # per text, when its caller reads the LayerNorm statistics
    hidden: list[np.ndarray]  # per text (n,C) over its own tokens, when request.hidden_states
    layer_norms: bool = True  # whether its caller reads each text's LayerNorm statistics
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


def _run_groups(model: TextEncoderModel, pending: Sequence[Rows], budget: int) -> None:
    """The texts of these requests, pooled, run by length groups; each request's rows written into it."""
    rows = [(p, i) for p in pending for i in range(len(p.request.input_ids))]
    lengths = [p.request.tokens[i] for p, i in rows]
    for group in length_groups(lengths, budget):
        members = [rows[k] for k in group]
        hidden = any(p.request.hidden_states for p, _ in members)  # (B,T,C): only when a member's caller reads it
        out = model.infer(stack([(p.request, i) for p, i in members], model.config.pad_token_id, hidden))
        for j, (p, i) in enumerate(members):
            p.embeddings[i] = out.sentence_embedding[j]
            n = p.request.tokens[i]
            if p.layer_norms:  # copies: a view would hold the whole group's outputs for the request's life
                p.stats[i] = [(name, mean[j, :n].copy(), std[j, :n].copy()) for name, mean, std in out.layer_norms]
            if p.request.hidden_states and out.last_hidden_state is not None:
                p.hidden[i] = out.last_hidden_state[j, :n].copy()


class TextBatcher:
    """Pools the texts of concurrent requests to one text encoder version (see the module's docstring)."""

    def __init__(self, model: TextEncoderModel, budget: int, delay_us: int, in_flight: Callable[[], int]) -> None:
        self._model = weakref.ref(model)  # the model holds its batcher: no cycle keeps a retired version alive
        self.budget = budget
        self.delay_s = delay_us / 1e6
        self._in_flight = in_flight
        self._queue: list[Rows] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def run(self, request: TextInput) -> Rows:
        """The embeddings (B,C), each text's LayerNorm statistics and hidden states (where asked), blocking until
        its groups have run."""
        model = self._model()
        assert model is not None  # the caller holds it
        embeddings = np.empty((len(request.tokens), model.config.hidden_size), np.float32)
        empty = np.empty((0, model.config.hidden_size), np.float32)
        stats: list[Stats] = [[] for _ in request.tokens]
        item = Rows(request, embeddings, stats, [empty] * len(stats), getattr(request, "layer_norms", True))
        if self._in_flight() <= 1:  # alone in the worker: nothing to pool with, so no hand-off
            _run_groups(model, [item], self.budget)
            return item
        with self._cond:
            self._queue.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"text-batcher-{model.name}", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        item.done.wait()
        if item.error is not None:
            raise item.error
        return item

    def _loop(self) -> None:
        while batch := self._gather():
            model = self._model()
            try:
                if model is None:
                    raise RuntimeError("the model version was unloaded")
                self._execute(model, batch)
            finally:
                for item in batch:
                    item.done.set()

    def _gather(self) -> list[Rows]:
        """Every queued request, and those arriving until the delay ends or every one in flight is in; [] (and
        the thread gone) after IDLE_S with nothing queued."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._queue), IDLE_S):
                self._thread = None
                return []
            deadline = time.monotonic() + self.delay_s
            while len(self._queue) < self._in_flight() and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(remaining)
            batch, self._queue = self._queue, []
            return batch

    def _execute(self, model: TextEncoderModel, batch: list[Rows]) -> None:
        try:
            _run_groups(model, batch, self.budget)
        except Exception:
            for item in batch:  # a failed pooled run must not fail the others: each alone, with its own error
                try:
                    _run_groups(model, [item], self.budget)
                except BaseException as e:  # handed to the caller's thread, which raises it
                    item.error = e


def _integers(arr: np.ndarray, name: str) -> np.ndarray:
    """Token inputs as int64: JSON's numbers arrive as float64, each of which must be a whole number."""
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64, copy=False)
    whole = np.isfinite(arr) & (np.mod(arr, 1) == 0) & (np.abs(arr) < 2**53)
    if not whole.all():
        raise InvalidInput(f"{arr[~whole][0]!r} is not a whole number; expected INT64 token ids", name)
    return arr.astype(np.int64)


@dataclass(frozen=True)
class Pooled(TextInput):
    """A request's texts to be pooled with concurrent requests' (/v1/embeddings', and V2's texts and token ids)."""

    layer_norms: bool = False  # each text's LayerNorm statistics in the answer (0 where not asked)


class PooledTextEncoder(TextEncoderModel):
    """The text-encoder kind as served: a Pooled request runs through the version's TextBatcher, and answers
    exactly as one run of it padded to its longest text would (its LayerNorm statistics and hidden states 0 at
    padding). Every protocol's request is a Pooled one, so that concurrent texts share runs whichever way they
    came; only the warm-up and validation run a TextInput as it is."""

    @property
    def blocks(self) -> bool:
        return True  # a pooled request waits for concurrent ones: never on the event loop

    def __init__(self, loaded: Loaded) -> None:
        super().__init__(loaded)
        s = loaded.settings
        self.pool = TextBatcher(self, s.text_batch_tokens, s.batch_delay_us, loaded.in_flight or (lambda: 1))
        # Over the Open Inference Protocol: `text` as BYTES, or the tokens themselves.
        tokens = tuple(dataclasses.replace(spec, optional=True) for spec in self.inputs)
        self.inputs = (TensorSpec(TEXT, ("BYTES",), (-1,), optional=True), *tokens)

    def check_tensors(self, tensors: Mapping[str, np.ndarray], f: Fields) -> None:
        """`text` alone, or input_ids and attention_mask (and token_type_ids where the model takes them)."""
        tokens = [t.name for t in self.inputs[1:]]
        if TEXT in tensors and len(tensors) > 1:
            raise InvalidInput(f"send text or the token inputs ({', '.join(tokens)}), not both", f"inputs.{TEXT}")
        if TEXT not in tensors and not all(name in tensors for name in tokens[:2]):
            raise InvalidInput(
                f"expected {TEXT} (BYTES), or {' and '.join(tokens[:2])} (INT64) for model {self.name!r}", "inputs"
            )

    def from_tensors(
        self, tensors: Mapping[str, np.ndarray], params: Mapping[str, Any], f: Fields, dtype: str = "FP32"
    ) -> TextInput:
        """The texts tokenized as served, or the token ids each checked, to be pooled; the hidden states and
        LayerNorm statistics computed too, as every output is sent when none is named."""
        if TEXT in tensors:
            request = self.tokenize(list(tensors[TEXT].reshape(-1)), f"inputs.{TEXT}")
        else:
            request = self._from_token_tensors(tensors)
        ids, mask, types = request.input_ids, request.attention_mask, request.token_type_ids
        return Pooled(ids, mask, types, hidden_states=True, layer_norms=True)

    def _from_token_tensors(self, tensors: Mapping[str, np.ndarray]) -> TextInput:
        tensors = {name: _integers(arr, f"inputs.{name}") for name, arr in tensors.items()}
        ids, mask = tensors["input_ids"], tensors["attention_mask"]
        for name, arr in tensors.items():
            if arr.ndim != 2 or arr.shape != ids.shape:
                raise InvalidInput(
                    f"shape {list(arr.shape)}; expected [batch, seq] as input_ids {list(ids.shape)}", f"inputs.{name}"
                )
        real = mask != 0
        request = self.from_ids([row[keep].tolist() for row, keep in zip(ids, real, strict=True)], "inputs.input_ids")
        given = tensors.get("token_type_ids")
        if given is not None and request.token_type_ids is not None:
            for i, (row, keep) in enumerate(zip(given, real, strict=True)):
                request.token_type_ids[i, : int(keep.sum())] = row[keep]
        return request

    def infer(self, request: TextInput) -> TextOutput:
        if not isinstance(request, Pooled):
            return super().infer(request)
        rows = self.pool.run(request)
        shape, tokens = request.input_ids.shape, request.tokens
        layer_norms = []
        for k, name in enumerate(self.layer_norms if request.layer_norms else ()):
            mean, std = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
            for i, (text, n) in enumerate(zip(rows.stats, tokens, strict=True)):
                mean[i, :n], std[i, :n] = text[k][1], text[k][2]
            layer_norms.append((name, mean, std))
        hidden = None
        if request.hidden_states:
            hidden = np.zeros((*shape, self.config.hidden_size), np.float32)
            for i, (states, n) in enumerate(zip(rows.hidden, tokens, strict=True)):
                hidden[i, :n] = states
        return TextOutput(rows.embeddings, layer_norms, self.info, tokens, hidden)
