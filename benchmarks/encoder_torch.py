"""In process: normserve's encoder run against torch's own Encoder with the same weights, at one thread each.

The torch side is app/export/modules.py's Encoder (the module the ONNX graph was exported from) with
models/encoder/<version>/weights.npz loaded strictly; normserve's side is the model's `run`, the one
onnxruntime run /encode makes (output and every LayerNorm's statistics), without the dynamic batcher,
whose queue delay (NORMSERVE_BATCH_DELAY_US) would otherwise be timed as well. Both at one intra-op
thread: normserve's default (NORMSERVE_INTRA_OP_THREADS=1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.core.encoder import EncoderModel
from app.core.runtime import Runtime
from benchmarks.inprocess import measure, sample


def encoder_vs_torch(runtime: Runtime, shapes: list[tuple[int, ...]], budget_s: float) -> list[dict[str, Any]]:
    """Median seconds per run of normserve's encoder and torch's at each shape, the answers checked to agree."""
    import torch

    from app.export.modules import Encoder, load_state

    model = runtime.get("encoder")
    assert isinstance(model, EncoderModel), "models/encoder is not an encoder"
    weights = model.path.parent / "weights.npz"
    encoder = Encoder(model.config).eval()
    with np.load(weights, allow_pickle=False) as npz:
        load_state(encoder, {k: torch.from_numpy(npz[k]) for k in npz.files}, weights)
    threads = torch.get_num_threads()
    torch.set_num_threads(runtime.settings.intra_op_threads or threads)
    rows = []
    try:
        for shape in shapes:
            x = sample(shape)
            xt, mask = torch.from_numpy(x), torch.zeros(shape[:2], dtype=torch.bool)

            feeds = {"input": x, "padding_mask": mask.numpy()}

            def ours(feeds: dict[str, np.ndarray] = feeds) -> np.ndarray:
                return model.run(feeds, model.output_names)[0]

            def theirs(xt: torch.Tensor = xt, mask: torch.Tensor = mask) -> np.ndarray:
                with torch.inference_mode():
                    out: np.ndarray = encoder(xt, mask)[0].numpy()
                return out

            diff = float(np.abs(ours() - theirs()).max())
            assert diff < 1e-3, f"normserve's encoder and torch's differ by {diff:.3g} at {shape}"
            ours_s, torch_s = measure(ours, budget_s).median_s, measure(theirs, budget_s).median_s
            rows.append({"shape": shape, "ours_s": ours_s, "torch_s": torch_s})
    finally:
        torch.set_num_threads(threads)
    return rows
