"""SageMaker's POST /invocations end to end, as TGI and vLLM serve it: the body says which API
it is for (`inputs`: TGI's compat route; `messages`: OpenAI's chat completions; `prompt`: its
completions), and the request is answered, streamed and refused as on that route → gateway
(Tornado, mutual TLS) → gRPC server (mutual TLS) → the real model. SageMaker's /ping is with
the other probes in test_gateway_tgi.py.

Runs with the other tests under tests/peers (their own pytest process: tritonclient); it
imports none of our packages but the stdlib helpers in gateway_clients.
"""

from __future__ import annotations

import json

import pytest
from gateway_clients import MODEL, curl_with, request

PROMPT = "The capital of France is"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TGI_BODY = {"inputs": PROMPT, "parameters": {"max_new_tokens": 4, "do_sample": False}}
CHAT_BODY = {"messages": QUESTION, "max_tokens": 16, "temperature": 0}
COMPLETION_BODY = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}


def invoke(gateway, client_files, body: object) -> tuple[int, object]:
    return request(gateway.url("business"), client_files, "/invocations", body)


def stream(gateway, client_files, body: dict) -> list[bytes]:
    """The `data:` payloads of a streamed /invocations reply."""
    reply = curl_with(client_files, gateway.url("business") + "/invocations",
                      body={**body, "stream": True}, stream=True)
    assert (reply.exit_code, reply.status) == (0, 200), reply.body
    assert reply.headers["content-type"].startswith("text/event-stream")
    return [line.removeprefix(b"data:").strip() for line in reply.body.splitlines()
            if line.startswith(b"data:")]


# Each API's body, answered as on its route ----------------------------------------------------

def test_a_tgi_body_is_answered_as_tgis_compat_route(gateway, client_files) -> None:
    status, reply = invoke(gateway, client_files, TGI_BODY)
    assert status == 200, reply
    assert reply == request(gateway.url("business"), client_files, "/", TGI_BODY)[1]
    [answer] = reply  # an array, as POST / answers
    assert answer["generated_text"].startswith(" Paris")


def test_a_tgi_body_streams_tgis_events(gateway, client_files) -> None:
    events = [json.loads(data) for data in stream(gateway, client_files, TGI_BODY)]
    *tokens, last = events
    assert all(event["generated_text"] is None for event in tokens)
    assert last["generated_text"] == "".join(event["token"]["text"] for event in events)
    assert last["generated_text"].startswith(" Paris") and len(events) == 4


def test_a_chat_body_is_answered_as_a_chat_completion(gateway, client_files) -> None:
    status, reply = invoke(gateway, client_files, CHAT_BODY)
    assert status == 200, reply
    assert (reply["object"], reply["model"]) == ("chat.completion", MODEL)
    _, chat = request(gateway.url("business"), client_files, "/v1/chat/completions", CHAT_BODY)
    assert reply["choices"][0]["message"] == chat["choices"][0]["message"]
    assert "Paris" in reply["choices"][0]["message"]["content"]


def test_a_chat_body_streams_chunks_then_done(gateway, client_files) -> None:
    *chunks, done = stream(gateway, client_files, CHAT_BODY)
    assert done == b"[DONE]"
    chunks = [json.loads(data) for data in chunks]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert "Paris" in "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)


def test_a_completion_body_is_answered_as_a_completion(gateway, client_files) -> None:
    status, reply = invoke(gateway, client_files, COMPLETION_BODY)
    assert status == 200, reply
    assert reply["object"] == "text_completion"
    assert reply["choices"][0]["text"].startswith(" Paris")
    assert reply["usage"]["completion_tokens"] == 4


# Refusals: a body for no API in OpenAI's shape (vLLM's), the others in their route's -------------

@pytest.mark.parametrize("body", [{"text_input": PROMPT}, [PROMPT], b"{"],
                         ids=["no-api-field", "an-array", "malformed"])
def test_a_body_for_no_api_is_refused_in_openais_shape(gateway, client_files, body) -> None:
    status, reply = invoke(gateway, client_files, body)
    assert status == 400, reply
    assert set(reply) == {"error"}
    assert (reply["error"]["type"], reply["error"]["code"]) == ("invalid_request_error", "400")
    if body != b"{":
        assert all(f"`{field}`" in reply["error"]["message"]
                   for field in ("inputs", "messages", "prompt"))


def test_a_tgi_body_is_refused_in_tgis_shape(gateway, client_files) -> None:
    status, reply = invoke(gateway, client_files,
                           {"inputs": PROMPT, "parameters": {"max_new_tokens": -1}})
    assert status == 422, reply
    assert reply["error_type"] == "validation" and "max_new_tokens" in reply["error"]


@pytest.mark.parametrize(("body", "param"), [
    ({**CHAT_BODY, "max_tokens": -1}, "max_tokens"),
    ({**COMPLETION_BODY, "suffix": "."}, "suffix"),
])
def test_an_openai_body_is_refused_in_openais_shape(gateway, client_files, body,
                                                    param) -> None:
    status, reply = invoke(gateway, client_files, body)
    assert status == 400, reply
    assert reply["error"]["param"] == param
    assert invoke(gateway, client_files, COMPLETION_BODY)[0] == 200  # still serving
