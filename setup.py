"""setuptools shim: compile the protocol buffers before packaging.

Everything declarative lives in pyproject.toml. This file only hooks `build_py`, which
setuptools runs both for wheels (`pip install .`) and for PEP 660 editable installs
(`pip install -e .`), so the generated `proto/*_pb2*.py` modules exist in the source
tree before anything is copied or mapped. The compile step itself is `proto/compile.py`,
loaded by file path because the `proto` package is not importable until it is built.
"""

from __future__ import annotations

import runpy
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithProtos(build_py):
    """`build_py` that first regenerates the gRPC/protobuf modules from `proto/*.proto`."""

    def run(self) -> None:
        compile_protos = runpy.run_path(str(ROOT / "proto" / "compile.py"))["compile_protos"]
        compile_protos(ROOT)
        super().run()


setup(cmdclass={"build_py": BuildPyWithProtos})
