"""The README's grpcurl call and tritonclient snippet work as written (against a test server:
its address and certificate folder replace 127.0.0.1:8001 and tls/dev/)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def snippet(section: str, language: str) -> str:
    text = README.read_text()
    start = text.index(section)
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(text, start)
    return match.group(1)


def localize(code: str, server, pki) -> str:
    return code.replace("127.0.0.1:8001", server.address).replace("tls/dev/", f"{pki.folder}/")


def test_readme_grpcurl_call_answers_paris(grpc_server, pki) -> None:
    command = localize(snippet("### grpcurl", "sh"), grpc_server, pki)
    bin_dir = Path(sys.executable).parent
    ran = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert ran.returncode == 0, ran.stderr
    assert '"finish_reason"' in ran.stdout and '"raw_output_contents"' in ran.stdout


def test_readme_tritonclient_snippet_runs(grpc_server, pki) -> None:
    code = localize(snippet("### tritonclient.grpc", "python"), grpc_server, pki)
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert ran.stdout.count("Paris") == 2, ran.stdout
    assert "length" in lines
    assert any(line.startswith("[[") for line in lines)
