"""Compile `proto/*.proto` into Python modules next to the sources.

Shared by `setup.py` (which loads this file by path, before the package is importable)
and the Makefile (`python -m switchboard.proto.compile`), so both produce identical output.
The sources are staged under `switchboard/proto/` in a scratch folder and compiled from
there, so the generated modules import each other as `switchboard.proto.<name>_pb2`, the
name the folder is installed under.
"""

from __future__ import annotations

import shutil
import tempfile
from importlib.resources import as_file, files
from pathlib import Path

from grpc_tools import protoc

PACKAGE_PATH = Path("switchboard", "proto")
GENERATED = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py")


def compile_protos(root: Path) -> None:
    """Generate `*_pb2.py`, `*_pb2.pyi` and `*_pb2_grpc.py` for every `root/proto/*.proto`."""
    folder = root.resolve() / "proto"
    sources = sorted(folder.glob("*.proto"))
    if not sources:
        raise RuntimeError(f"no .proto files found under {folder}")
    with tempfile.TemporaryDirectory() as scratch, \
            as_file(files("grpc_tools") / "_proto") as well_known:
        staged = Path(scratch) / PACKAGE_PATH
        staged.mkdir(parents=True)
        for source in sources:
            shutil.copy(source, staged / source.name)
        status = protoc.main([
            "grpc_tools.protoc", f"-I{scratch}", f"-I{well_known}", f"--python_out={scratch}",
            f"--pyi_out={scratch}", f"--grpc_python_out={scratch}",
            *(str(staged / source.name) for source in sources)])
        if status != 0:
            raise RuntimeError(
                f"protoc failed with exit status {status} compiling "
                f"{', '.join(source.name for source in sources)} (its error messages are printed above)")
        for pattern in GENERATED:
            for generated in staged.glob(pattern):
                shutil.copy(generated, folder / generated.name)


if __name__ == "__main__":
    compile_protos(Path(__file__).resolve().parent.parent)
