"""Dependency rules between the packages, checked on their source's import statements, and the
one import name the distribution installs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "engine": {"grpc", "grpc_health", "grpc_reflection", "tornado", "proto", "server", "gateway",
               "tls", "switchboard"},
    "server": {"tornado", "gateway", "switchboard"},
    "gateway": {"torch", "transformers", "engine", "server", "switchboard"},
    "tls": {"grpc", "torch", "engine", "server", "gateway", "proto", "switchboard"},
}


def imported_modules(source: str) -> dict[str, int]:
    """Top-level names of the absolute imports in `source`, with the line of their first use; an
    import of `switchboard.X…` names X, and one of `switchboard` itself (the CLI) names it."""
    modules: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top, _, rest = name.partition(".")
            if top == "switchboard" and rest:
                top = rest.partition(".")[0]
            modules.setdefault(top, node.lineno)
    return modules


def test_imported_modules_finds_every_absolute_import() -> None:
    source = ("import grpc.aio\nimport os, torch as t\nfrom switchboard.proto import grpc_service_pb2\n"
              "from . import sibling\n\ndef lazy():\n    from switchboard.server.codec import aggregate\n"
              "    from switchboard import cli\n")
    assert imported_modules(source) == {"grpc": 1, "os": 2, "torch": 2, "proto": 3, "server": 7,
                                        "switchboard": 8}


@pytest.mark.parametrize("package", FORBIDDEN)
def test_package_imports_none_of_its_forbidden_dependencies(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    violations = [f"{path.relative_to(ROOT)}:{line} imports {module}"
                  for path in files
                  for module, line in imported_modules(path.read_text()).items()
                  if module in FORBIDDEN[package]]
    assert violations == []


@pytest.mark.parametrize("modules", ["switchboard.gateway.app", "switchboard.cli"])
def test_the_gateway_and_the_command_line_do_not_load_torch(modules: str) -> None:
    """`switchboard gateway` runs through switchboard.cli: neither may pull in torch."""
    result = subprocess.run(
        [sys.executable, "-c", f"import {modules}, sys; assert 'torch' not in sys.modules"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_distribution_installs_one_import_name_beside_proto_plus(tmp_path: Path) -> None:
    """proto-plus installs the import name `proto`, as every Google Cloud client pulls it in:
    Switchboard's own folder of that name must not shadow it, nor it Switchboard's."""
    result = subprocess.run(
        [sys.executable, "-c", "import proto, switchboard.proto.switchboard_pb2, switchboard.cli; "
                               "assert proto.Message.__module__.startswith('proto.'), proto"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
