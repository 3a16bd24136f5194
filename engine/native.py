"""The engine's native CPU kernels (engine/csrc), compiled with torch's cpp_extension for the
processor at hand on first use and kept in torch's extensions cache; where they cannot be
built (no compiler), the engine runs without them.

Built with -march=native, so a build is named after the processor's flags as well as its
sources and torch's version: a cache shared with another processor never loads it."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
from importlib.resources import files
from pathlib import Path

import torch

from switchboard.engine.timing_store import cpuinfo

logger = logging.getLogger(__name__)

SOURCES = ("decode_attention.cpp", "decode_layers.cpp", "int4_linear.cpp", "layer_ops.cpp")
HEADERS = ("vector_math.h",)
DTYPES = (torch.float32, torch.bfloat16)  # the dtypes of queries and caches the kernels take
# OpenMP as torch's own operators use it: at::parallel_for's team is torch's (the loader finds
# the libgomp torch loaded by its name).
FLAGS = ("-O3", "-march=native", "-fopenmp")


@functools.cache
def kernels() -> object | None:
    """torch.ops.switchboard once the kernels are loaded; None where they cannot be built."""
    sources, headers = ([Path(str(files(__package__).joinpath("csrc", name))) for name in names]
                        for names in (SOURCES, HEADERS))
    processor = cpuinfo(("flags",)).get("flags", platform.machine())
    digest = hashlib.sha256()
    for part in (*(path.read_bytes() for path in (*sources, *headers)), " ".join(FLAGS),
                 torch.__version__, processor):
        digest.update(part if isinstance(part, bytes) else part.encode())
    try:
        from torch.utils import cpp_extension
        _find_ninja()
        cpp_extension.load(name=f"switchboard_kernels_{digest.hexdigest()[:16]}",
                           sources=[str(source) for source in sources],
                           extra_cflags=list(FLAGS), extra_ldflags=["-fopenmp"],
                           is_python_module=False, verbose=False)
    except Exception as error:  # a missing compiler or ninja: run without them
        logger.warning("native CPU kernels unavailable, attention runs through SDPA: %r", error)
        return None
    return torch.ops.switchboard


def _find_ninja() -> None:
    """cpp_extension runs `ninja` from PATH: the one the ninja package installed beside this
    Python, where PATH has none (a venv's tools are not on PATH unless it is activated)."""
    if shutil.which("ninja") is None:
        import ninja
        os.environ["PATH"] = os.pathsep.join((ninja.BIN_DIR, os.environ.get("PATH", "")))


if __name__ == "__main__":  # `make install` builds them ahead of the first server
    logging.basicConfig(level=logging.INFO)
    print("native CPU kernels:", "ready" if kernels() is not None else "unavailable")
