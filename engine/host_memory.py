"""Returning the heap memory a model load freed to the operating system.

glibc keeps freed heap memory for reuse rather than returning it, and loading leaves much of
it behind: weights are fused, quantized and repacked through transient copies, whose freed
heap would otherwise stay resident (docs/engine-measurements.md#host-memory).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


def release_free_heap() -> None:
    """malloc_trim(0) where the C library is glibc; elsewhere nothing to do."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    return getattr(ctypes.CDLL(name), "malloc_trim", None)
