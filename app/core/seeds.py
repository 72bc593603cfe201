"""The seeds' worked examples, defined once: their inputs and parameters, and the outputs the seeds print.

These are the golden vectors: the float64 reference, the exported models, both protocols and the playground
are checked against them, and the OpenAPI examples are built from them. Each number is as the seed prints it,
so each example carries the tolerance its printed precision allows. NumPy only: no torch, no server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Rows = tuple[Any, ...]  # a nested tuple of floats: immutable, and np.asarray reads it as it would a list


@dataclass(frozen=True)
class LayerNormExample:
    """A layer norm worked in a seed: x over its last len(normalized_shape) dims, gamma 1 and beta 0."""

    name: str
    about: str  # what the example shows
    x: Rows
    normalized_shape: tuple[int, ...]
    eps: float
    eps_mode: str  # "var": (x - mean) / sqrt(var + eps); "std": (x - mean) / (sqrt(var) + eps)
    output: Rows  # same shape as x
    mean: tuple[float, ...]  # one per normalized row
    std: tuple[float, ...]  # sqrt(var), population variance without eps: what /normalize reports as stats.std
    atol: float  # how closely the exact float64 result matches these numbers, given the digits the seed prints
    denominator: tuple[float, ...] | None = None  # what each row is divided by, where the seed prints it

    @property
    def k(self) -> int:
        """How many trailing dims are normalized."""
        return len(self.normalized_shape)

    def request(self) -> dict[str, Any]:
        """The /normalize body: data, plus normalized_shape, eps and eps_mode where they are not the defaults."""
        body: dict[str, Any] = {"data": np.asarray(self.x).tolist()}
        if self.k != 1:
            body["normalized_shape"] = list(self.normalized_shape)
        if self.eps != 1e-5:
            body["eps"] = self.eps
        if self.eps_mode != "var":
            body["eps_mode"] = self.eps_mode
        return body


@dataclass(frozen=True)
class PositionalEncodingExample:
    """A sinusoidal positional encoding table worked in a seed: sin and cos interleaved per frequency."""

    name: str
    about: str
    max_sequence_length: int
    d_model: int
    encoding: Rows  # [max_sequence_length, d_model]
    atol: float


SEED003 = LayerNormExample(
    name="seed003-var",
    about=(
        "Seed 003's example: two words of three features, each normalized over its own features, with eps 1e-5"
        " added to the variance (torch.nn.LayerNorm's convention): hence ±1.2238 rather than the eps-free ±1.2247."
    ),
    x=((0.2, 0.1, 0.3), (0.5, 0.1, 0.1)),
    normalized_shape=(3,),
    eps=1e-5,
    eps_mode="var",
    output=((0.0, -1.2238, 1.2238), (1.4140, -0.7070, -0.7070)),
    mean=(0.2, 0.23333),
    std=(0.08165, 0.18856),
    atol=5e-5,  # four decimals
    denominator=(0.0817, 0.1886),  # the seed's `std = (var + epsilon).sqrt()`
)

SEED003_LAST_TWO_DIMS = LayerNormExample(
    name="seed003-var-last-two-dims",
    about=(
        "Seeds 002 and 003 in code: the same two words reshaped to [2, 1, 3] and normalized over the last two dims"
        " (normalized_shape [1, 3]), which gives the same numbers as normalizing each word over its features."
    ),
    x=(((0.2, 0.1, 0.3),), ((0.5, 0.1, 0.1),)),
    normalized_shape=(1, 3),
    eps=1e-5,
    eps_mode="var",
    output=(((0.0, -1.2238, 1.2238),), ((1.4140, -0.7070, -0.7070),)),
    mean=(0.2, 0.23333),
    std=(0.08165, 0.18856),
    atol=5e-5,  # four decimals
    denominator=(0.0817, 0.1886),
)

SEED000 = LayerNormExample(
    name="seed000-std",
    about=(
        "Seed 000: a batch of two rows of four features with eps 1e-6 added to the standard deviation, not the"
        " variance (eps_mode std); NumPy prints eight decimals."
    ),
    x=((0.2, 0.8, 1.0, 1.2), (1.0, 0.0, 0.5, 1.5)),
    normalized_shape=(4,),
    eps=1e-6,
    eps_mode="std",
    output=((-1.60356317, 0.0, 0.53452106, 1.06904211), (0.4472128, -1.34163839, -0.4472128, 1.34163839)),
    mean=(0.8, 0.75),
    std=(0.37416574, 0.55901699),  # sqrt(0.14) and sqrt(0.3125); the seed prints only the output
    atol=5e-9,  # eight decimals
)

# Seed 003's LayerNormalization class on torch.randn(5, 3, 8): its first [3, 8] block, whose input, mean,
# standard deviation and output the seed prints in full (to four decimals).
_SEED003_RANDN_DENOMINATOR = (0.5693, 1.1192, 0.7916)

SEED003_RANDN = LayerNormExample(
    name="seed003-randn-rows",
    about=(
        "Seed 003's LayerNormalization class: random rows of eight features normalized over the last dim"
        " (eps 1e-5, added to the variance); rows of any mean and spread come out with mean 0 and std 1."
    ),
    x=(
        (-0.0179, 0.4530, 0.4010, -0.2802, 0.5412, 1.4781, -0.2056, -0.3623),
        (2.0039, -0.1214, 0.7030, -0.8229, -1.9977, 0.7847, -0.1746, -0.4260),
        (0.3596, -1.4512, 0.7291, 0.1631, -0.8912, 0.8370, 0.0927, -0.9296),
    ),
    normalized_shape=(8,),
    eps=1e-5,
    eps_mode="var",
    output=(
        (-0.4722, 0.3551, 0.2637, -0.9331, 0.5099, 2.1557, -0.8019, -1.0773),
        (1.7962, -0.1028, 0.6339, -0.7296, -1.7793, 0.7069, -0.1503, -0.3749),
        (0.6265, -1.6612, 1.0933, 0.3782, -0.9537, 1.2296, 0.2894, -1.0022),
    ),
    mean=(0.2509, -0.0064, -0.1363),
    # The seed prints sqrt(var + 1e-5); for these rows that is sqrt(var) to within 1e-5, well inside atol.
    std=_SEED003_RANDN_DENOMINATOR,
    # The inputs themselves are printed to four decimals: the exact result of those rounded inputs lands
    # within 1.2e-4 of the printed output.
    atol=2e-4,
    denominator=_SEED003_RANDN_DENOMINATOR,
)

LAYER_NORM_EXAMPLES: tuple[LayerNormExample, ...] = (SEED003, SEED003_LAST_TWO_DIMS, SEED000, SEED003_RANDN)

SEED002_POSITIONAL_ENCODING = PositionalEncodingExample(
    name="seed002-positional-encoding",
    about=(
        "Seed 002's PositionalEncoding(d_model=6, max_sequence_length=10): sin(pos / 10000^(2i/d)) in the even"
        " columns and cos in the odd ones, so row 0 alternates 0 and 1 and the last pair turns slowest."
    ),
    max_sequence_length=10,
    d_model=6,
    encoding=(
        (0.0000, 1.0000, 0.0000, 1.0000, 0.0000, 1.0000),
        (0.8415, 0.5403, 0.0464, 0.9989, 0.0022, 1.0000),
        (0.9093, -0.4161, 0.0927, 0.9957, 0.0043, 1.0000),
        (0.1411, -0.9900, 0.1388, 0.9903, 0.0065, 1.0000),
        (-0.7568, -0.6536, 0.1846, 0.9828, 0.0086, 1.0000),
        (-0.9589, 0.2837, 0.2300, 0.9732, 0.0108, 0.9999),
        (-0.2794, 0.9602, 0.2749, 0.9615, 0.0129, 0.9999),
        (0.6570, 0.7539, 0.3192, 0.9477, 0.0151, 0.9999),
        (0.9894, -0.1455, 0.3629, 0.9318, 0.0172, 0.9999),
        (0.4121, -0.9111, 0.4057, 0.9140, 0.0194, 0.9998),
    ),
    atol=5e-5,  # four decimals
)
