"""The README's grpcurl call, curl calls and client snippets work as written (against test
processes: their addresses and certificate folder replace the default ones and tls/dev/)."""

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


def localize_gateway(code: str, gateway, pki) -> str:
    business, management = gateway.url("business"), gateway.url("management")
    return (code.replace("https://127.0.0.1:1025", business)
            .replace("https://127.0.0.1:1026", management)
            .replace('"127.0.0.1:1025"', f'"{business.removeprefix("https://")}"')
            .replace("tls/dev/", f"{pki.folder}/"))


def test_readme_curl_calls_answer(gateway, pki) -> None:
    command = localize_gateway(snippet("### curl, over the gateway", "sh"), gateway, pki)
    ran = subprocess.run(["bash", "-ec", command], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert '"text_output": " Paris' in ran.stdout, ran.stdout  # Triton's /generate
    assert '"text_output":" Paris' in ran.stdout  # its stream
    assert '"text_output": "The capital of France is Paris' in ran.stdout  # vLLM backend's
    assert '"output0"' in ran.stdout and '"total_slots"' in ran.stdout
    assert '"generated_text": " Paris' in ran.stdout  # TGI
    assert '{"text": ["The capital of France is Paris' in ran.stdout  # vLLM's demo server
    assert '"content": "The capital of France is Paris' in ran.stdout  # OpenAI chat


def test_readme_openai_and_huggingface_hub_snippet_runs(gateway, pki) -> None:
    code = localize_gateway(snippet("### openai and huggingface_hub", "python"), gateway, pki)
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    chat, tgi = ran.stdout.splitlines()[:2]
    assert "Paris" in chat
    assert tgi.startswith("TextGenerationOutput(generated_text=' Paris"), tgi


def test_readme_tritonclient_http_snippet_runs(gateway, pki) -> None:
    code = localize_gateway(snippet("### tritonclient.http", "python"), gateway, pki)
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("[["), ran.stdout


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
