"""The seeds' worked examples as data: golden vectors every path is checked against (to 1e-4)."""

from __future__ import annotations

from typing import Any

import pytest

SEED003_X = [[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]]
SEED003_Y = [[0.0, -1.2238, 1.2238], [1.4140, -0.7070, -0.7070]]
SEED000_X = [[0.2, 0.8, 1.0, 1.2], [1.0, 0.0, 0.5, 1.5]]
SEED000_Y = [[-1.60356317, 0.0, 0.53452106, 1.06904211], [0.4472128, -1.34163839, -0.4472128, 1.34163839]]

# request fields, expected output, expected stats (mean, and std = sqrt(var))
GOLDEN: list[Any] = [
    pytest.param(
        {"data": SEED003_X},
        SEED003_Y,
        {"mean": [0.2, 0.23333], "std": [0.08165, 0.18856]},
        id="seed003-var",
    ),
    pytest.param(
        {"data": [[row] for row in SEED003_X], "normalized_shape": [1, 3]},
        [[row] for row in SEED003_Y],
        {"mean": [0.2, 0.23333], "std": [0.08165, 0.18856]},
        id="seed003-var-last-two-dims",
    ),
    pytest.param(
        {"data": SEED000_X, "eps": 1e-6, "eps_mode": "std"},
        SEED000_Y,
        {"mean": [0.8, 0.75], "std": [0.37417, 0.55902]},
        id="seed000-std",
    ),
]
