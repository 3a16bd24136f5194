"""Compile `proto/*.proto` into Python modules next to the sources.

Shared by `setup.py` (which loads this file by path, before the package is importable)
and the Makefile (`python -m proto.compile`), so both produce identical output.
Sources are compiled with the repository root as the include path, which makes the
generated modules import each other as `proto.<name>_pb2`.
"""

from __future__ import annotations

from importlib.resources import as_file, files
from pathlib import Path

from grpc_tools import protoc


def compile_protos(root: Path) -> None:
    """Generate `*_pb2.py`, `*_pb2.pyi` and `*_pb2_grpc.py` for every `root/proto/*.proto`."""
    root = root.resolve()
    sources = sorted(path.relative_to(root).as_posix() for path in (root / "proto").glob("*.proto"))
    if not sources:
        raise RuntimeError(f"no .proto files found under {root / 'proto'}")
    with as_file(files("grpc_tools") / "_proto") as well_known:
        args = [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--python_out={root}",
            f"--pyi_out={root}",
            f"--grpc_python_out={root}",
            *(str(root / source) for source in sources),
        ]
        status = protoc.main(args)
    if status != 0:
        raise RuntimeError(
            f"protoc failed with exit status {status} compiling {', '.join(sources)} "
            "(its error messages are printed above)"
        )


if __name__ == "__main__":
    compile_protos(Path(__file__).resolve().parent.parent)
