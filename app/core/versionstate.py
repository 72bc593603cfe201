"""What a version's state is, in the words of the repository index (Triton's): the Runtime writes it
(app/core/runtime.py), the protocols and the workers' shared state (app/server/modelsync.py) read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple


class State(StrEnum):
    """A version's state in the repository index, as Triton names them."""

    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


@dataclass(frozen=True)
class VersionState:
    """What the Runtime holds of each version it tried: its state, and why (not READY, or on older files)."""

    state: State
    reason: str = ""


class IndexRow(NamedTuple):
    """One version in the repository index; the protocols write it as their wire's row."""

    name: str
    version: int
    state: State
    reason: str
