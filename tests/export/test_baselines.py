"""app/export/baselines.py: the drift monitor's baseline in the manifest, and `--calibration FILE.npy`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.core.monitor import LEVELS, Baseline
from app.core.reference import EncoderConfig, layer_norm_names
from app.export import baselines
from app.export.modules import seeded_encoder

SMALL = EncoderConfig(d_model=16, num_heads=2, d_ff=32, num_layers=1, max_sequence_length=8)


def test_layernorm_stats_are_each_rows_mean_and_population_std() -> None:
    rows = [np.array([[1.0, 3.0], [2.0, 2.0]]), np.array([[0.0, 4.0]])]
    ((name, (means, stds)),) = baselines.layernorm_stats(rows).items()
    assert name == "layernorm"
    assert means.tolist() == [2.0, 2.0, 2.0] and stds.tolist() == [1.0, 0.0, 2.0]


def test_encoder_stats_cover_every_layernorm_at_unpadded_positions_only() -> None:
    model = seeded_encoder(SMALL, seed=0)
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    mask = np.zeros((2, 5), dtype=bool)
    mask[1, 3:] = True  # two padded positions
    stats = baselines.encoder_stats([(x, mask), (x[:1], None)], weights, SMALL)
    assert list(stats) == layer_norm_names(SMALL)
    for means, stds in stats.values():
        assert means.shape == stds.shape == (8 + 5,)
        assert (stds > 0).all()


def test_manifest_entry_is_a_baseline_per_layernorm_that_reads_back() -> None:
    stats = {"a": (np.arange(10.0), np.arange(10.0) + 1), "b": (np.zeros(3), np.ones(3))}
    entry = baselines.manifest_entry(stats, "some inputs")
    assert entry["inputs"] == "some inputs" and list(entry["layers"]) == ["a", "b"]
    a = Baseline.from_json(entry["layers"]["a"])
    assert a.mean.count == 10 and a.std.quantiles[LEVELS.index(0.5)] == pytest.approx(5.5)


@pytest.mark.parametrize(
    ("array", "ndim", "message"),
    [
        (np.zeros((2, 3, 4), np.float32), 3, "expected a float array (batch, seq, 16), got shape [2, 3, 4]"),
        (np.zeros((3, 16), np.float32), 3, "expected a float array (batch, seq, 16), got shape [3, 16]"),
        (np.zeros((0, 16), np.float32), None, "expected a float array (batch, seq, 16), got shape [0, 16]"),
        (np.array([[np.nan] * 16]), None, "holds NaN or infinite values"),
        (np.array([["a"] * 16]), None, "expected a float array (batch, seq, 16), got dtype <U1"),
    ],
    ids=["last-dim", "rank", "empty", "nan", "strings"],
)
def test_a_calibration_file_that_does_not_fit_is_refused_naming_it(
    tmp_path: Path, array: np.ndarray, ndim: int | None, message: str
) -> None:
    path = tmp_path / "calibration.npy"
    np.save(path, array)
    with pytest.raises(ValueError) as e:
        baselines.load_calibration(path, "(batch, seq, 16)", ndim, (16,))
    assert str(e.value) == f"--calibration {path}: {message}"


def test_a_calibration_file_that_is_not_npy_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "calibration.npy"
    path.write_text("not numpy")
    with pytest.raises(ValueError, match=r"^--calibration .*calibration\.npy: not a readable \.npy file \("):
        baselines.load_calibration(path, "(batch, seq, 16)", 3, (16,))


def test_a_calibration_file_is_read_as_float32(tmp_path: Path) -> None:
    path = tmp_path / "calibration.npy"
    np.save(path, np.ones((2, 3, 16), np.float64))
    got = baselines.load_calibration(path, "(batch, seq, 16)", 3, (16,))
    assert got.dtype == np.float32 and got.shape == (2, 3, 16)
