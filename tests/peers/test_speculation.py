"""A server started with n-gram speculation (`--speculate 3`), driven through its gateway with
the real `openai` SDK: its answers and streams are the plain server's, token for token, and
/metrics counts the guesses verified and accepted (in all and by position) under vLLM's names.

Imports none of our packages (see gateway_clients); prometheus_client parses /metrics.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import openai
import pytest
from conftest import own_service
from gateway_clients import MODEL, fetch, ssl_context
from prometheus_client.parser import text_string_to_metric_families

from switchboard.process import GatewayProcess

# SmolLM2 repeats the line, which guesses from the request's own text predict.
REPEAT = [{"role": "user", "content": "Repeat this line three times: the cat sat on the mat."}]


@pytest.fixture(scope="module")
def speculating(pki) -> Iterator[GatewayProcess]:
    with own_service(pki.folder, server_args=("--speculate", "3")) as (_, gateway):
        yield gateway


def sdk(gateway: GatewayProcess, client_files) -> openai.OpenAI:
    http = httpx2.Client(verify=ssl_context(client_files), timeout=120)
    return openai.OpenAI(base_url=gateway.url("business") + "/v1", api_key="unused",
                         http_client=http, max_retries=0)


def counters(gateway: GatewayProcess, client_files) -> dict[str, float]:
    """vLLM's speculation counters, by name (a per-position one's name ends in `[position]`)."""
    status, body = fetch(gateway.url("metrics"), client_files, "/metrics")
    assert status == 200, body
    return {sample.name + (f"[{sample.labels['position']}]" if "position" in sample.labels
                           else ""): sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples if sample.name.startswith("vllm:spec_decode_")}


def test_a_speculating_server_answers_and_streams_the_plain_server_s_tokens(
        gateway, speculating, client_files) -> None:
    options = {"model": MODEL, "messages": REPEAT, "temperature": 0, "max_tokens": 48}
    plain = sdk(gateway, client_files).chat.completions.create(**options)
    client = sdk(speculating, client_files)
    before = counters(speculating, client_files)
    answer = client.chat.completions.create(**options)
    after = counters(speculating, client_files)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                       client.chat.completions.create(**options, stream=True) if chunk.choices)
    assert "cat sat on the mat" in plain.choices[0].message.content
    assert answer.choices[0].message.content == plain.choices[0].message.content == streamed
    assert answer.usage.completion_tokens == plain.usage.completion_tokens
    accepted = (after["vllm:spec_decode_num_accepted_tokens_total"]
                - before.get("vllm:spec_decode_num_accepted_tokens_total", 0))
    verified = (after["vllm:spec_decode_num_draft_tokens_total"]
                - before.get("vllm:spec_decode_num_draft_tokens_total", 0))
    assert 0 < accepted <= verified
    by_position = [after[f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{position}]"]
                   - before.get(f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{position}]",
                                0)
                   for position in range(3)]
    assert sum(by_position) == accepted and by_position == sorted(by_position, reverse=True)
