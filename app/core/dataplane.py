"""The data plane's requests and answers: what every protocol decodes into and encodes from.

A protocol's codec builds a `NormalizeInput` or an `EncodeInput` and names its own fields
(`Fields`); the input then checks every rule of the request itself, once for all protocols,
so that a message reads `eps: ...` on /normalize and `parameters.eps: ...` on V2 but says the
same thing. Outputs carry every statistic, computed in one place (`NormalizeOutput.std`, ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from app.core import reference
from app.core.halfprecision import HALF_DTYPES
from app.core.tensors import to_finite_float
from app.errors import InvalidInput, shown

EPS_MODES = ("var", "std")
# The datatypes an output is computed for: float32 answers (FP64 is their exact widening) or rounded once to half.
OUTPUT_DATATYPES = ("FP32", "FP64", *HALF_DTYPES)
MAX_WARNED_ROWS = 5  # rows named one by one in NormalizeInput.warnings; the rest are counted


@dataclass(frozen=True)
class Fields:
    """What a protocol calls each field of the data plane's inputs, for the messages that name them."""

    x: str = "data"
    gamma: str = "gamma"
    beta: str = "beta"
    k: str = "normalized_shape"
    eps: str = "eps"
    eps_mode: str = "eps_mode"
    padding_mask: str = "padding_mask"
    dtype: str = "dtype"


@dataclass(frozen=True)
class ModelInfo:
    """Which model version answered: reported in every response."""

    name: str
    version: str
    sha256: str

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "sha256": self.sha256}


@dataclass(frozen=True)
class NormalizeInput:
    """Layer norm of x over its last k dims; the constructor checks every rule and casts to float32."""

    x: np.ndarray  # any shape, rank >= 1: float32 once constructed
    k: int = 1
    eps: float = 1e-5
    eps_mode: str = "var"
    gamma: np.ndarray | None = None  # x.shape[-k:]
    beta: np.ndarray | None = None  # x.shape[-k:]
    backend: Literal["onnxruntime", "numpy"] = "onnxruntime"
    validate: bool = False
    fields: Fields = field(default=Fields(), repr=False, compare=False)
    dtype: str = "FP32"  # the output's datatype (OUTPUT_DATATYPES): a half type rounds it once, at the end
    # The numbers as sent, when a codec has rounded x to a half type already (JSON data with `dtype`).
    sent: np.ndarray | None = field(default=None, repr=False, compare=False)
    # Set here: what the answer should tell the client about its input (rows that float32 rounded together).
    warnings: tuple[str, ...] = field(default=(), init=False, compare=False)

    def __post_init__(self) -> None:
        f = self.fields
        set_ = object.__setattr__  # frozen: the checked, float32 values replace what the codec handed over
        source = np.asarray(self.x)
        set_(self, "x", to_finite_float(source, f.x))
        check_eps(self.eps, self.eps_mode, f)
        check_dtype(self.dtype, f)
        rank = self.x.ndim
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= rank:
            raise InvalidInput(f"expected an integer in 1..{rank} (the input's rank), got {shown(self.k)}", f.k)
        # Only a rounding from a wider type can round distinct values together (half types widen exactly): the
        # cast to float32, or a codec's to the half type x came in (then x's own type is the one named).
        sent = source if self.sent is None else np.asarray(self.sent)
        set_(self, "sent", None)  # not held through the request: float64 numbers are 8 bytes each (peak RSS)
        if sent.dtype != np.float32 and sent.dtype not in HALF_DTYPES.values():
            name = source.dtype.name if source.dtype in HALF_DTYPES.values() else "float32"
            set_(self, "warnings", rounded_together(sent, self.x, self.k, f.x, name))
        for name in ("gamma", "beta"):
            value = getattr(self, name)
            if value is not None:
                set_(self, name, self._affine(value, getattr(f, name)))

    def _affine(self, value: np.ndarray, name: str) -> np.ndarray:
        expected = self.x.shape[self.x.ndim - self.k :]
        if value.shape != expected:
            raise InvalidInput(
                f"shape {list(value.shape)} does not match the normalized dims of {self.fields.x}, {list(expected)}",
                name,
            )
        return to_finite_float(value, name)

    @property
    def cols(self) -> int:
        """D, the size of one normalized row."""
        return math.prod(self.x.shape[self.x.ndim - self.k :])

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """The shape of the statistics: x.shape[:-k]."""
        return self.x.shape[: self.x.ndim - self.k]


def rounded_together(source: np.ndarray, x: np.ndarray, k: int, name: str, to: str = "float32") -> tuple[str, ...]:
    """A warning per row (up to MAX_WARNED_ROWS) whose distinct values, as sent, all round to one value of `to`.

    Such a row is constant to the model: its var is 0 and its output is beta, which reads as a correct
    answer unless it is said. Only the rows constant in float32 are compared with the values as sent.
    """
    rows = x.reshape(-1, math.prod(x.shape[x.ndim - k :]))  # R,D view
    if rows.shape[1] < 2:  # a row of one value has no distinct values to round together
        return ()
    # Only rows whose first two values are equal can be constant: one comparison of two columns rules out
    # the rest of a typical input before the per-row min and max (3 us of 5 on (8, 64) rows, measured).
    maybe = np.flatnonzero(rows[:, 0] == rows[:, 1])
    if not maybe.size:
        return ()
    constant = maybe[rows[maybe].min(axis=1) == rows[maybe].max(axis=1)]
    if not constant.size:
        return ()
    sent = source.reshape(rows.shape)[constant]  # c,D: the constant rows, as sent
    hit = constant[sent.min(axis=1) != sent.max(axis=1)]
    batch = x.shape[: x.ndim - k]

    def row(r: int) -> str:
        return f" row {[int(i) for i in np.unravel_index(r, batch)]}:" if batch else ""

    warnings = [
        f"{name}:{row(r)} its values differ but all round to the same {to}, {float(rows[r, 0])}, "
        "so its var is 0 and its normalized values are 0"
        for r in hit[:MAX_WARNED_ROWS]
    ]
    if hit.size > MAX_WARNED_ROWS:
        warnings.append(f"{name}: {hit.size - MAX_WARNED_ROWS} more rows whose values all round to one {to} each")
    return tuple(warnings)


def check_eps(eps: Any, eps_mode: Any, f: Fields) -> None:
    """eps a finite number > 0, eps_mode var or std: the one check of both, for every protocol."""
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < math.inf:
        raise InvalidInput(f"expected a finite number > 0, got {shown(eps)}", f.eps)
    if eps_mode not in EPS_MODES:
        raise InvalidInput(f"expected 'var' or 'std', got {shown(eps_mode)}", f.eps_mode)


def check_dtype(dtype: Any, f: Fields) -> None:
    """The output datatype is one the data plane computes (protocols refuse others first, in their own words)."""
    if dtype not in OUTPUT_DATATYPES:
        raise InvalidInput(f"expected one of {', '.join(OUTPUT_DATATYPES)}, got {shown(dtype)}", f.dtype)


@dataclass(frozen=True)
class NormalizeOutput:
    output: np.ndarray  # x.shape; float32 from onnxruntime, float64 from numpy, the half type asked (dtype)
    mean: np.ndarray  # x.shape[:-k], float64
    var: np.ndarray  # x.shape[:-k], float64, population variance
    eps: float
    eps_mode: str
    backend: str
    model: ModelInfo | None
    validation: dict[str, Any] | None
    warnings: tuple[str, ...] = ()  # the input's (NormalizeInput.warnings)

    @property
    def std(self) -> np.ndarray:
        """sqrt(var): what /normalize reports."""
        std: np.ndarray = np.sqrt(self.var)
        return std

    @property
    def inv_std_dev(self) -> np.ndarray:
        """1 / the denominator the output was divided by, in float64: what ONNX's LayerNormalization reports."""
        inv: np.ndarray = 1.0 / reference.denominator(self.var, self.eps, self.eps_mode)
        return inv


@dataclass(frozen=True)
class EncoderLimits:
    """What an encoder accepts: fixed at export."""

    d_model: int
    max_sequence_length: int
    model: str  # the model and version, as an error names them: "'encoder', version 1"


@dataclass(frozen=True)
class EncodeInput:
    """An encoder's input (B,T,C) and padding mask (B,T); the constructor checks them against the model's limits.

    one_sequence: the protocol also takes a single sequence [seq, d_model] (REST does); it becomes a batch of one.
    """

    x: np.ndarray  # B,T,C (or T,C with one_sequence): float32 B,T,C once constructed
    padding_mask: np.ndarray | None  # B,T (or T) bool, true = padding
    limits: EncoderLimits
    validate: bool = False
    fields: Fields = field(default=Fields(), repr=False, compare=False)
    one_sequence: bool = False
    dtype: str = "FP32"  # the output's datatype (OUTPUT_DATATYPES): a half type rounds it once, at the end

    def __post_init__(self) -> None:
        f, lim = self.fields, self.limits
        check_dtype(self.dtype, f)
        x = to_finite_float(self.x, f.x)  # first, so that element indices are the ones the client sent
        mask = self.padding_mask
        if self.one_sequence and x.ndim == 2:  # checked before it becomes a batch of one: the shapes as sent
            if mask is not None and mask.shape not in ((len(x),), (1, len(x))):
                raise InvalidInput(
                    f"shape {list(mask.shape)} does not match {f.x}'s [seq] = [{len(x)}]", f.padding_mask
                )
            x, mask = x[None], None if mask is None else mask.reshape(1, -1)
        if x.ndim != 3:
            expected = f"[batch, seq, {lim.d_model}]" + (f" or [seq, {lim.d_model}]" if self.one_sequence else "")
            raise InvalidInput(f"rank {self.x.ndim} (shape {list(self.x.shape)}); expected {expected}", f.x)
        B, T, C = x.shape
        if C != lim.d_model:
            # Named: with several encoders served, the client may have meant another (or no `model` at all).
            raise InvalidInput(f"last dimension is {C}, expected d_model = {lim.d_model} (model {lim.model})", f.x)
        if T > lim.max_sequence_length:
            raise InvalidInput(
                f"sequence length {T} exceeds max_sequence_length {lim.max_sequence_length}"
                " (set at export: normserve export --max-sequence-length)",
                f.x,
            )
        if mask is not None and mask.shape != (B, T):
            raise InvalidInput(
                f"shape {list(mask.shape)} does not match {f.x}'s [batch, seq] = {[B, T]}", f.padding_mask
            )
        # Contiguous and aligned: V2 binary inputs are views of the request body.
        object.__setattr__(self, "x", np.require(x, np.float32, ["C", "A"]))
        object.__setattr__(self, "padding_mask", mask)

    @property
    def mask(self) -> np.ndarray:
        """The padding mask, all false when none was sent."""
        return np.zeros(self.x.shape[:2], dtype=bool) if self.padding_mask is None else self.padding_mask


@dataclass(frozen=True)
class EncodeOutput:
    output: np.ndarray  # B,T,C float32, or the half type asked (EncodeInput.dtype)
    layer_norms: list[tuple[str, np.ndarray, np.ndarray]]  # (name, mean B,T, std B,T), in execution order
    model: ModelInfo
    validation: dict[str, Any] | None
