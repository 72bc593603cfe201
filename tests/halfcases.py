"""Half-precision LayerNorm cases (issue 26): each datatype's hard rows, and their float64 truth.

Random rows; rows at offsets where the type's spacing is 0.5 or more (the variance of a row cancels in
half-precision sums); tiny magnitudes near the type's subnormals; magnitudes whose squares overflow the
half type (FP16) or float32 itself (BF16); constant rows. Each with and without a half-precision gamma and beta.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.core import reference
from app.core.halfprecision import HALF_DTYPES, narrow, widen

D = 64  # elements per row: small enough for JSON bodies, large enough for half-precision sums to fail

# (id, offset, scale) per datatype: the row is offset + scale * N(0, 1), rounded to the datatype.
ROWS: dict[str, list[tuple[str, float, float]]] = {
    "FP16": [
        ("random", 0.0, 3.0),
        ("offset-spacing-0.5", 600.0, 2.0),  # FP16's spacing is 0.5 in [512, 1024)
        ("offset-spacing-8", 9000.0, 40.0),  # and 8 in [8192, 16384)
        ("tiny-subnormal", 0.0, 2e-6),  # FP16's normals start at 6.1e-5; its subnormals are 6e-8 apart
        ("squares-overflow-fp16", 0.0, 2e4),  # x**2 > 65504 past 256: every square overflows
        ("constant", 7.0, 0.0),
    ],
    "BF16": [
        ("random", 0.0, 3.0),
        ("offset-spacing-2", 300.0, 8.0),  # BF16's spacing is 2 in [256, 512)
        ("offset-spacing-1024", 200000.0, 3000.0),
        ("tiny-subnormal", 0.0, 3e-38),  # BF16's normals start at 1.2e-38, as float32's
        ("squares-overflow-fp32", 0.0, 1e25),  # x**2 overflows float32 (and BF16) past 1.8e19
        ("constant", -3.5, 0.0),
    ],
}


@dataclass(frozen=True)
class HalfCase:
    id: str
    datatype: str
    x: np.ndarray  # 3,D in the half type
    gamma: np.ndarray | None  # D in the half type
    beta: np.ndarray | None

    def truth(self, eps: float = 1e-5, eps_mode: str = "var") -> np.ndarray:
        """The float64 LayerNorm of the exact half-precision values."""
        g, b = (None if t is None else widen(t) for t in (self.gamma, self.beta))
        return reference.layer_norm(widen(self.x), 1, eps, eps_mode, g, b).output


def half_cases() -> list[HalfCase]:
    """Every datatype's rows, plain and affine."""
    cases = []
    for datatype, rows in ROWS.items():
        for i, (name, offset, scale) in enumerate(rows):
            rng = np.random.default_rng(i)
            x = narrow(offset + scale * rng.standard_normal((3, D)), datatype, "x")
            g = narrow(1 + 0.5 * rng.standard_normal(D), datatype, "gamma")
            b = narrow(0.3 * rng.standard_normal(D), datatype, "beta")
            cases.append(HalfCase(f"{datatype}-{name}", datatype, x, None, None))
            cases.append(HalfCase(f"{datatype}-{name}-affine", datatype, x, g, b))
    return cases


CASES = half_cases()
DATATYPES = tuple(HALF_DTYPES)
