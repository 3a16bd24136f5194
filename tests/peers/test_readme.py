"""The README's grpcurl call, curl calls and client snippets, and docs/protocols.md's curl calls,
work as written (against test processes: their addresses and certificate folder replace the
default ones and tls/dev/)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PROTOCOLS = ROOT / "docs" / "protocols.md"


def snippet(section: str, language: str, document: Path = README) -> str:
    text = document.read_text()
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


def run_curl_calls(document: Path, section: str, gateway, pki) -> str:
    command = localize_gateway(snippet(section, "sh", document), gateway, pki)
    ran = subprocess.run(["bash", "-ec", command], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def test_readme_curl_calls_answer(gateway, pki) -> None:
    stdout = run_curl_calls(README, "### curl, over the gateway", gateway, pki)
    assert '"text_output": " Paris' in stdout, stdout  # Triton's /generate
    assert '"generated_text": " Paris' in stdout  # TGI
    assert '"content": "The capital of France is Paris' in stdout  # OpenAI chat


def test_protocols_doc_curl_calls_answer(gateway, pki) -> None:
    stdout = run_curl_calls(PROTOCOLS, "## More curl calls", gateway, pki)
    assert '"text_output":" Paris' in stdout, stdout  # Triton's generate_stream
    assert '"text_output": "The capital of France is Paris' in stdout  # vLLM backend's
    assert '"output0"' in stdout and '"total_slots"' in stdout
    assert '{"text": ["The capital of France is Paris' in stdout  # vLLM's demo server


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
