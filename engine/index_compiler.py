"""Compiling a structured-output index in a process of its own, within bounds.

How much an index costs depends on the pattern and the vocabulary, not on the pattern's length:
`[^"]{2000}` is ten characters, and its index over a 49k-token vocabulary holds ~2,000 states
that each allow almost every token. Nothing outside outlines-core can tell that cost before
compiling, and a compile in a thread can neither be measured nor stopped. So each compile
runs in a short-lived process of its own that the kernel holds to a memory and a CPU-time
limit (`setrlimit`), at a low CPU priority so the engine's steps come first, and that is
killed as soon as nobody waits for its index. Its reply is the index's serialized form, whose
length is what the index costs in the parent (see `GuideBuilder`).

Run as `python -m switchboard.engine.index_compiler MEMORY_BYTES CPU_SECONDS`: it reads
pickle((eos_token_id, {token bytes: [ids]}, regex)) on stdin and writes the index's bytes on
stdout (exit 0), or the reason the vocabulary cannot follow the pattern (exit INVALID). This
module imports only the standard library and outlines-core, so the process starts in a
fraction of a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import resource
import signal
import sys
from dataclasses import dataclass

logger = logging.getLogger(__name__)

INVALID = 3  # exit status: the pattern cannot be followed, the reason on stdout
OUT_OF_MEMORY = 4  # exit status: Python ran out of memory (outlines-core aborts instead)
# Below the engine's thread, which then keeps most of a core they share
# (docs/engine-measurements.md#structured-output); not the lowest, which a busy engine would
# starve.
COMPILE_PRIORITY = 10


class CompileRefused(Exception):
    """The pattern cannot be compiled within the bounds, or not at all; `reason` says why
    in words a client can act on (the caller names the field)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class CompileLimits:
    """memory_bytes: the compiling process's data limit (heap and anonymous mappings);
    cpu_seconds: its CPU time, which does not grow when other work shares the cores."""

    memory_bytes: int
    cpu_seconds: int


async def compile_index(regex: str, vocabulary: bytes, limits: CompileLimits) -> bytes:
    """The serialized index of `regex` over `vocabulary` (pickle of (eos id, token bytes →
    ids)); `Index.from_binary` reads it. Raises CompileRefused past the limits or for a
    pattern the vocabulary cannot follow. Cancelling the call kills the process."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", __name__, str(limits.memory_bytes), str(limits.cpu_seconds),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        request = vocabulary + pickle.dumps(regex)
        output, errors = await process.communicate(request)
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
    status = process.returncode
    if status == 0:
        return output
    if status == INVALID:
        raise CompileRefused(output.decode())
    if status in (OUT_OF_MEMORY, -signal.SIGABRT):
        raise CompileRefused(f"its index needs more than {limits.memory_bytes // 2**20} MiB "
                             "to compile (guidedCompileMiB)")
    if status in (-signal.SIGXCPU, -signal.SIGKILL):
        raise CompileRefused(f"its index takes more than {limits.cpu_seconds} s of CPU time "
                             "to compile (guidedCompileCpuSeconds)")
    logger.error("compiling a structured-output index failed with status %s: %s", status,
                 errors.decode(errors="replace")[-2000:])
    raise RuntimeError(f"the index compiler exited with status {status}")


def _serve(memory_bytes: int, cpu_seconds: int) -> int:
    os.nice(COMPILE_PRIORITY)
    # Soft CPU limit: SIGXCPU; the hard one a second later: SIGKILL, should it be caught.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
    from outlines_core import Index, Vocabulary

    unpickler = pickle.Unpickler(sys.stdin.buffer)
    eos_token_id, tokens = unpickler.load()
    regex = unpickler.load()
    try:
        index = Index(regex, Vocabulary(eos_token_id, tokens))
        _, (serialized,) = index.__reduce__()[:2]
    except ValueError as error:
        sys.stdout.write(f"cannot be followed with this model's vocabulary: {error}")
        return INVALID
    except MemoryError:
        return OUT_OF_MEMORY
    sys.stdout.buffer.write(serialized)
    return 0


if __name__ == "__main__":
    sys.exit(_serve(int(sys.argv[1]), int(sys.argv[2])))
