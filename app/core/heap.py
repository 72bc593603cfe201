"""Memory a load's warm-up used, given back: onnxruntime's arena past its first chunk, and glibc's free heap.

A model's warm-up runs the longest sequence its manifest admits (encoder.py), once; onnxruntime's CPU arena
keeps what that run took for the life of the session, and glibc keeps freed heap pages the process may never
reuse. Measured on the default models: the idle worker 183 MiB, 123 MiB with both given back, where a
64 MiB request's peak comes on top (docs/benchmarks.md, section 5).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

import onnxruntime as ort


def shrinking_run() -> ort.RunOptions:
    """Run options whose run frees the CPU arena's chunks it no longer uses as it ends (its first chunk stays).

    Only for one-off runs: shrinking every request's run would make the next one allocate afresh."""
    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None on a C library without it (musl, macOS)."""
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim  # type: ignore[no-any-return]


def trim() -> bool:
    """Give the heap's free pages back to the OS; False where the C library cannot."""
    malloc_trim = _malloc_trim()
    return malloc_trim is not None and bool(malloc_trim(0) or True)
