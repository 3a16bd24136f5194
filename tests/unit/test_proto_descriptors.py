"""Our `proto/*.proto` must describe exactly the schema tritonclient was generated from.

`tritonclient.grpc` talks to our server with its own compiled copy of Triton's protos, so
any drift in a field number, type, label, oneof or enum value would silently corrupt the
wire format. Each side is dumped in its own subprocess (see `_dump_descriptors.py`)
because both register the same `inference.*` names in protobuf's default pool.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DUMP_SCRIPT = Path(__file__).with_name("_dump_descriptors.py")

TRITON_MODULES = ["tritonclient.grpc.service_pb2", "tritonclient.grpc.model_config_pb2"]
OUR_MODULES = ["switchboard.proto.grpc_service_pb2", "switchboard.proto.model_config_pb2"]
KINDS = ["messages", "enums", "methods"]

Schema = dict[str, dict[str, Any]]


def _dump(modules: list[str]) -> Schema:
    """Run the dump script on `modules` in a fresh interpreter that can import `proto`."""
    python_path = [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(python_path)}
    result = subprocess.run(
        [sys.executable, str(DUMP_SCRIPT), *modules],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, (
        f"dumping {modules} failed (for proto.*: run `make proto` or `pip install -e .`):\n"
        f"{result.stderr}"
    )
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def triton() -> Schema:
    return _dump(TRITON_MODULES)


@pytest.fixture(scope="module")
def ours() -> Schema:
    return _dump(OUR_MODULES)


def _differences(path: str, mine: Any, theirs: Any) -> list[str]:
    """Every leaf where `mine` differs from `theirs`, recursing into nested dicts."""
    if not (isinstance(mine, dict) and isinstance(theirs, dict)):
        return [] if mine == theirs else [f"{path}: ours is {mine!r}, tritonclient has {theirs!r}"]
    differences: list[str] = []
    for key in sorted(mine.keys() | theirs.keys()):
        if key not in mine:
            differences.append(f"{path}.{key}: missing from ours")
        elif key not in theirs:
            differences.append(f"{path}.{key}: not in tritonclient's schema")
        else:
            differences += _differences(f"{path}.{key}", mine[key], theirs[key])
    return differences



@pytest.mark.parametrize("kind", KINDS)
def test_nothing_from_triton_is_missing(kind: str, triton: Schema, ours: Schema) -> None:
    missing = sorted(triton[kind].keys() - ours[kind].keys())
    assert not missing, f"{kind} defined by tritonclient but missing from proto/: {missing}"


@pytest.mark.parametrize("kind", KINDS)
def test_shared_definitions_match(kind: str, triton: Schema, ours: Schema) -> None:
    """Messages: every field's number, type, label, referenced type and oneof; enums: every
    value's number; methods: request/response types and streaming flags."""
    differences = [
        difference
        for name in sorted(triton[kind].keys() & ours[kind].keys())
        for difference in _differences(name, ours[kind][name], triton[kind][name])
    ]
    assert not differences, f"{kind} differ from tritonclient's:\n" + "\n".join(differences)
