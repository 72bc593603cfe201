"""Memory a load's warm-up used, given back: onnxruntime's arena past its first chunk, and glibc's free heap.

A model's warm-up runs the longest sequence its manifest admits (encoder.py), once; onnxruntime's CPU arena
keeps what that run took for the life of the session, and glibc keeps freed heap pages the process may never
reuse. Measured on the default models: the idle worker 183 MiB, 123 MiB with both given back, where a
64 MiB request's peak comes on top (docs/benchmarks.md, section 5).

Between requests the opposite holds: glibc maps chunks above its mmap threshold afresh and returns its heap's
free top above its trim threshold; both start at 128 KiB and rise only when a mapped chunk is freed (to its
size, and twice it). A worker whose requests never free a chunk as large as their temporaries together (FP16
V2 binary (8,128,768): a 1.5 MB body, 3 MB arrays) trimmed its heap after every request and faulted it back
in on the next: 1,700 minor faults and 12.7 ms of server CPU per request, 7.5 with the thresholds raised
(pinned, one core each for server and load, medians; before the warm-ups' memory was given back, which
changed the heap's history so that it stopped: by chance, so the thresholds are now set, not inherited).
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


# Freed once per worker: the mmap threshold rises to it and the trim threshold to twice it, so up to 32 MiB
# of free heap stays mapped between requests (glibc caps the mmap threshold at 32 MiB).
RAISE_TO = 16 << 20


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None on a C library without it (musl, macOS)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim  # type: ignore[no-any-return]


def trim() -> bool:
    """Give the heap's free pages back to the OS; False where the C library cannot."""
    malloc_trim = _malloc_trim()
    if malloc_trim is None:
        return False
    malloc_trim(0)  # 1 if it released memory, 0 if there was none to release: done either way
    return True


def raise_thresholds(size: int = RAISE_TO) -> bool:
    """Allocate and free one mapped chunk of size bytes, so a request's freed arrays stay for the next one;
    False where the C library is not glibc (nothing done)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "gnu_get_libc_version"):
        return False
    malloc, free = libc.malloc, libc.free
    malloc.argtypes, malloc.restype, free.argtypes = [ctypes.c_size_t], ctypes.c_void_p, [ctypes.c_void_p]
    free(malloc(size))  # never written: no page is touched
    return True
