"""The gateway's TGI routes and vLLM's demo `/generate` end to end: TGI's own client
(huggingface_hub.InferenceClient) and curl with MindIE's TGI example bodies → gateway (Tornado,
mutual TLS) → gRPC server (mutual TLS) → the real model.

Runs with the other tests under tests/peers (their own pytest process: tritonclient); it
imports none of our packages but the stdlib helpers in gateway_clients.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx2
import huggingface_hub
import pytest
from gateway_clients import MODEL, curl_with, request, ssl_context
from huggingface_hub import InferenceClient
from huggingface_hub.errors import ValidationError
from huggingface_hub.utils._http import default_client_factory

PROMPT = "The capital of France is"
PROMPT_IDS = [504, 3575, 282, 4649, 314]  # PROMPT in SmolLM2's vocabulary
PARIS = 7042  # " Paris", greedily the first token after PROMPT
TOKEN_FIELDS = {"id", "text", "logprob", "special"}

# MindIE's TGI example (its docs, "TGI" interface): the same parameters for /, /generate and
# /generate_stream.
MINDIE_PARAMETERS = {"best_of": 1, "decoder_input_details": False, "details": True,
                     "do_sample": True, "max_new_tokens": 20, "repetition_penalty": 1.03,
                     "return_full_text": False, "seed": None, "stop": ["photographer"],
                     "temperature": 0.5, "top_k": 10, "top_p": 0.95, "truncate": None,
                     "typical_p": 0.5, "watermark": False}
MINDIE_BODY = {"inputs": "My name is Olivier and I", "parameters": MINDIE_PARAMETERS,
               "stream": False}


def business(gateway, path: str) -> str:
    return gateway.url("business") + path


# 1. TGI's client, huggingface_hub.InferenceClient, over mutual TLS ---------------------------

@pytest.fixture(scope="module")
def tgi(gateway, client_files) -> Iterator[InferenceClient]:
    context = ssl_context(client_files)
    huggingface_hub.set_client_factory(lambda: httpx2.Client(verify=context, timeout=120))
    yield InferenceClient(base_url=gateway.url("business"))
    huggingface_hub.set_client_factory(default_client_factory)  # closes our session too


@pytest.fixture(scope="module")
def greedy_details(tgi):
    return tgi.text_generation(PROMPT, max_new_tokens=6, details=True)


def test_watermark_is_accepted_and_ignored_as_mindie_does(tgi) -> None:
    marked = tgi.text_generation(PROMPT, max_new_tokens=4, watermark=True)
    assert marked == tgi.text_generation(PROMPT, max_new_tokens=4, watermark=False)


def test_text_generation_with_details(greedy_details) -> None:
    assert greedy_details.generated_text.startswith(" Paris")
    details = greedy_details.details
    assert details.finish_reason == "length"
    assert details.generated_tokens == len(details.tokens) == 6
    assert "".join(token.text for token in details.tokens) == greedy_details.generated_text
    assert details.tokens[0].id == PARIS
    assert all(token.logprob <= 0 and token.special is False for token in details.tokens)
    assert details.prefill == []  # no decoder_input_details
    assert details.seed is None  # greedy: TGI reports no seed


def test_text_generation_without_details_is_the_text(tgi, greedy_details) -> None:
    assert tgi.text_generation(PROMPT, max_new_tokens=6) == greedy_details.generated_text


def test_streamed_tokens_spell_the_final_text(tgi, greedy_details) -> None:
    events = list(tgi.text_generation(PROMPT, max_new_tokens=6, details=True, stream=True))
    *partial, last = events
    assert all(event.generated_text is None and event.details is None for event in partial)
    assert "".join(event.token.text for event in events) == last.generated_text
    assert last.generated_text == greedy_details.generated_text
    assert [event.token.id for event in events] == [t.id for t in greedy_details.details.tokens]
    assert last.details.finish_reason == "length"
    assert last.details.generated_tokens == len(events) == 6


def test_streamed_text_without_details(tgi, greedy_details) -> None:
    pieces = list(tgi.text_generation(PROMPT, max_new_tokens=6, stream=True))
    assert all(isinstance(piece, str) for piece in pieces)
    assert "".join(pieces) == greedy_details.generated_text


def test_token_texts_spell_characters_split_across_tokens(tgi) -> None:
    """As TGI's decode_token: a token that ends mid-character has the text "", the one that
    completes it the whole character, so the texts join into the generated text, streamed or
    in details (SmolLM2 spells most Chinese characters with two or three byte tokens)."""
    prompt = "北京是中国的首都，"
    events = list(tgi.text_generation(prompt, max_new_tokens=12, details=True, stream=True))
    texts = [event.token.text for event in events if not event.token.special]
    final = events[-1].generated_text
    assert any(ord(character) > 0x2E80 for character in final)  # CJK, not only ASCII
    assert "\ufffd" not in "".join(texts)
    assert "".join(texts) == final
    assert "".join(tgi.text_generation(prompt, max_new_tokens=12, stream=True)) == final
    reply = tgi.text_generation(prompt, max_new_tokens=12, details=True)
    assert reply.generated_text == final
    assert [t.id for t in reply.details.tokens] == [event.token.id for event in events]
    tokens = [t.text for t in reply.details.tokens if not t.special]
    assert "\ufffd" not in "".join(tokens) and "".join(tokens) == final
    assert len(events) > len(final)  # some character took several tokens


def test_decoder_input_details_gives_the_prompt_tokens(tgi) -> None:
    reply = tgi.text_generation(PROMPT, max_new_tokens=2, details=True,
                                decoder_input_details=True)
    prefill = reply.details.prefill
    assert [token.id for token in prefill] == PROMPT_IDS
    assert "".join(token.text for token in prefill) == PROMPT
    assert prefill[0].logprob is None
    assert all(token.logprob is not None and token.logprob <= 0 for token in prefill[1:])


def test_the_client_raises_a_validation_error_naming_the_field(tgi) -> None:
    with pytest.raises(ValidationError, match="max_new_tokens"):
        tgi.text_generation(PROMPT, max_new_tokens=-1)
    assert tgi.text_generation(PROMPT, max_new_tokens=1) == " Paris"


def test_a_stop_sequence_stays_in_the_generated_text(tgi) -> None:
    reply = tgi.text_generation(PROMPT, max_new_tokens=8, details=True, stop=["."])
    assert reply.details.finish_reason == "stop_sequence"
    assert reply.generated_text == " Paris."
    assert "".join(token.text for token in reply.details.tokens) == reply.generated_text


def test_a_stop_sequence_cuts_no_token_and_shifts_no_token_text(tgi, greedy_details) -> None:
    """As TGI: the token that completes a stop sequence stays whole, and token texts are the
    tokens' own whether or not a stop sequence could still match (streamed or not)."""
    inside = tgi.text_generation(PROMPT, max_new_tokens=4, details=True, stop=["ari"])
    assert (inside.generated_text, inside.details.finish_reason) == (" Paris", "stop_sequence")
    assert [(token.id, token.text) for token in inside.details.tokens] == [(PARIS, " Paris")]
    expected = [(token.id, token.text) for token in greedy_details.details.tokens]
    never = ["no such sequence"]
    events = list(tgi.text_generation(PROMPT, max_new_tokens=6, details=True, stream=True,
                                      stop=never))
    assert [(event.token.id, event.token.text) for event in events] == expected
    reply = tgi.text_generation(PROMPT, max_new_tokens=6, details=True, stop=never)
    assert [(token.id, token.text) for token in reply.details.tokens] == expected



CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                        "is_capital": {"type": "boolean"}},
        "required": ["city", "is_capital"]}


def test_a_grammar_keeps_the_text_to_a_json_schema_or_a_regex(tgi) -> None:
    answer = tgi.text_generation("The capital of France, as JSON:", max_new_tokens=40,
                                 grammar={"type": "json", "value": CITY})
    assert set(json.loads(answer)) == {"city", "is_capital"}
    assert tgi.text_generation("Is Paris in France? Answer:", max_new_tokens=5,
                               grammar={"type": "regex", "value": "(yes|no)"}) in ("yes", "no")
    with pytest.raises(ValidationError, match="grammar"):
        tgi.text_generation(PROMPT, max_new_tokens=5, grammar={"type": "regex", "value": "("})


def test_chat_completion_through_tgis_client(tgi) -> None:
    """InferenceClient sends the model name "dummy" to a server given by URL: TGI ignores the
    name, and so must a drop-in replacement."""
    reply = tgi.chat_completion([{"role": "user", "content": "What is the capital of France?"}],
                                max_tokens=16, temperature=0)
    assert "Paris" in reply.choices[0].message.content
    assert reply.model == MODEL


def test_seed_0_reproduces_its_sample_and_is_reported_back(tgi) -> None:
    """TGI's seed is a u64: 0 (a common client default) is a seed, sent back in details."""
    def sample():
        return tgi.text_generation(PROMPT, max_new_tokens=4, do_sample=True, temperature=1.0,
                                   seed=0, details=True)

    first, again = sample(), sample()
    assert first.generated_text and again.generated_text == first.generated_text
    assert first.details.seed == again.details.seed == 0

    def chat() -> str:
        return tgi.chat_completion([{"role": "user", "content": "What is the capital of France?"}],
                                   max_tokens=4, temperature=1.0, seed=0).choices[0].message.content

    first_answer = chat()
    assert first_answer and chat() == first_answer


# 2. curl with MindIE's TGI examples ----------------------------------------------------------

def assert_token(token: dict) -> None:
    assert set(token) == TOKEN_FIELDS
    assert isinstance(token["id"], int) and isinstance(token["text"], str)
    assert token["logprob"] <= 0 and isinstance(token["special"], bool)


def assert_mindie_reply(reply: dict) -> None:
    """{generated_text, details{finish_reason, generated_tokens, seed, tokens}} for the
    MindIE body (sampled; stop "photographer"; 20 tokens at most)."""
    assert {"generated_text", "details"} <= set(reply)
    text, details = reply["generated_text"], reply["details"]
    assert isinstance(text, str) and text
    assert details["finish_reason"] in ("length", "eos_token", "stop_sequence")
    if details["finish_reason"] != "stop_sequence":
        assert "photographer" not in text
    assert 1 <= details["generated_tokens"] <= 20
    if details["finish_reason"] == "length":
        assert details["generated_tokens"] == 20
    assert len(details["tokens"]) == details["generated_tokens"]
    for token in details["tokens"]:
        assert_token(token)
    assert isinstance(details["seed"], int) and details["seed"] > 0
    if details["finish_reason"] == "length":
        assert "".join(token["text"] for token in details["tokens"]) == text


def test_curl_compat_route_mindie_example(gateway, client_files) -> None:
    reply = curl_with(client_files, business(gateway, "/"), body=MINDIE_BODY)
    assert (reply.exit_code, reply.status) == (0, 200), reply.body
    assert reply.headers["content-type"].startswith("application/json")
    document = reply.json()
    assert isinstance(document, list) and len(document) == 1
    assert_mindie_reply(document[0])


def test_curl_generate_mindie_example(gateway, client_files) -> None:
    reply = curl_with(client_files, business(gateway, "/generate"), body=MINDIE_BODY)
    assert (reply.exit_code, reply.status) == (0, 200), reply.body
    assert reply.headers["content-type"].startswith("application/json")
    assert_mindie_reply(reply.json())


def assert_mindie_stream(reply) -> None:
    assert (reply.exit_code, reply.status) == (0, 200), reply.body
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = reply.events()
    *partial, last = events
    for event in events:
        assert_token(event["token"])
    assert all(event["generated_text"] is None and event["details"] is None for event in partial)
    details = last["details"]
    assert {"finish_reason", "generated_tokens", "seed", "prompt_tokens"} <= set(details)
    assert details["finish_reason"] in ("length", "eos_token", "stop_sequence")
    assert details["generated_tokens"] == len(events) <= 20
    assert details["prompt_tokens"] > 0
    assert isinstance(details["seed"], int) and details["seed"] > 0
    assert isinstance(last["generated_text"], str) and last["generated_text"]
    if details["finish_reason"] == "length":
        assert details["generated_tokens"] == 20
        assert "".join(event["token"]["text"] for event in events) == last["generated_text"]


def test_curl_generate_stream_mindie_example(gateway, client_files) -> None:
    assert_mindie_stream(curl_with(client_files, business(gateway, "/generate_stream"),
                                   body=MINDIE_BODY, stream=True))


def test_curl_compat_route_streams_when_asked(gateway, client_files) -> None:
    assert_mindie_stream(curl_with(client_files, business(gateway, "/"),
                                   body={**MINDIE_BODY, "stream": True}, stream=True))


def test_curl_info(gateway, client_files) -> None:
    reply = curl_with(client_files, business(gateway, "/info"))
    assert (reply.exit_code, reply.status) == (0, 200), reply.body
    info = reply.json()
    assert info["model_id"] == MODEL
    assert 0 < info["max_input_length"] < info["max_total_tokens"]
    assert info["max_best_of"] >= 1
    assert info["max_stop_sequences"] >= 1
    assert info["max_concurrent_requests"] >= 1 and info["validation_workers"] == 1
    assert isinstance(info["version"], str) and info["version"]


@pytest.mark.parametrize("path", ["/health", "/", "/ping"])
def test_curl_health(gateway, client_files, path) -> None:
    reply = curl_with(client_files, business(gateway, path))
    assert (reply.exit_code, reply.status) == (0, 200), reply.body
    assert reply.body == b"" and "content-type" not in reply.headers


def test_sagemakers_ping_answers_a_post_too_as_vllm_does(gateway, client_files) -> None:
    reply = curl_with(client_files, business(gateway, "/ping"), body={})
    assert (reply.exit_code, reply.status, reply.body) == (0, 200, b"")


# 3. vLLM's demo server: /generate with `prompt` ----------------------------------------------

@pytest.fixture(scope="module")
def vllm_greedy(gateway, client_files) -> str:
    status, reply = request(gateway.url("business"), client_files, "/generate",
                            {"prompt": PROMPT, "max_tokens": 6, "temperature": 0})
    assert status == 200, reply
    [text] = reply["text"]
    return text


def test_vllm_generate_answers_prompt_and_completion(vllm_greedy) -> None:
    assert vllm_greedy.startswith(PROMPT + " Paris")
    assert len(vllm_greedy) > len(PROMPT + " Paris")


def test_vllm_generate_n_2(gateway, client_files) -> None:
    status, reply = request(gateway.url("business"), client_files, "/generate",
                            {"prompt": PROMPT, "max_tokens": 4, "n": 2, "seed": 11})
    assert status == 200, reply
    assert set(reply) == {"text"} and len(reply["text"]) == 2
    assert all(text.startswith(PROMPT) and len(text) > len(PROMPT) for text in reply["text"])


@pytest.mark.parametrize("seed", [0, -5])
def test_vllm_generate_seeds_0_and_below_reproduce_their_sample(gateway, client_files,
                                                                seed: int) -> None:
    """vLLM's seed is an int64."""
    def sample() -> list[str]:
        status, reply = request(gateway.url("business"), client_files, "/generate",
                                {"prompt": PROMPT, "max_tokens": 4, "temperature": 1.0,
                                 "seed": seed})
        assert status == 200, reply
        return reply["text"]

    first = sample()
    assert len(first) == 1 and sample() == first


def test_vllm_generate_streams_newline_delimited_cumulative_texts(gateway, client_files,
                                                              vllm_greedy) -> None:
    reply = curl_with(client_files, business(gateway, "/generate"), stream=True,
                      body={"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": True})
    assert (reply.exit_code, reply.status) == (0, 200), reply.body
    assert reply.body.endswith(b"\n")
    documents = [json.loads(line) for line in reply.body.splitlines()]
    assert len(documents) >= 2
    assert all(set(document) == {"text"} and len(document["text"]) == 1 for document in documents)
    texts = [document["text"][0] for document in documents]
    assert all(text.startswith(PROMPT) for text in texts)
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:]))
    assert texts[-1] == vllm_greedy


# 4. Validation: each protocol's error body, and the next request is served -------------------

def assert_tgi_error(status: int, reply: object, field: str) -> None:
    assert status == 422, reply
    assert set(reply) == {"error", "error_type"}
    assert reply["error_type"] == "validation"
    assert field in reply["error"]


def assert_still_serving(gateway, client_files) -> None:
    status, reply = request(gateway.url("business"), client_files, "/generate",
                            {"inputs": PROMPT, "parameters": {"max_new_tokens": 1}})
    assert (status, reply) == (200, {"generated_text": " Paris"})


@pytest.mark.parametrize(("path", "body", "field"), [
    pytest.param("/generate", {"parameters": {"max_new_tokens": 2}}, "inputs",
                 id="generate-no-inputs"),
    pytest.param("/generate_stream", {"parameters": {"max_new_tokens": 2}}, "inputs",
                 id="generate_stream-no-inputs"),
    pytest.param("/", {"parameters": {"max_new_tokens": 2}}, "inputs", id="compat-no-inputs"),
    pytest.param("/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": -1}},
                 "max_new_tokens", id="generate-negative-max_new_tokens"),
    pytest.param("/generate_stream", {"inputs": PROMPT, "parameters": {"max_new_tokens": -1}},
                 "max_new_tokens", id="generate_stream-negative-max_new_tokens"),
    pytest.param("/generate_stream", {"inputs": PROMPT, "parameters": {
        "max_new_tokens": 2, "best_of": 2, "do_sample": True}}, "best_of",
        id="generate_stream-best_of-2"),
    pytest.param("/generate", {"inputs": PROMPT, "parameters": {
        "max_new_tokens": 2, "best_of": 2, "do_sample": True, "seed": 3}}, "best_of",
        id="generate-best_of-2-with-seed"),
    pytest.param("/generate", {"prompt": PROMPT, "max_tokens": 2, "temperature": -1},
                 "temperature", id="vllm-negative-temperature"),
    pytest.param("/generate", {"prompt": PROMPT, "max_tokens": -1}, "max_tokens",
                 id="vllm-negative-max_tokens"),
])
def test_invalid_requests_get_the_protocols_error_body(gateway, client_files, path, body,
                                                       field) -> None:
    status, reply = request(gateway.url("business"), client_files, path, body)
    assert_tgi_error(status, reply, field)
    assert_still_serving(gateway, client_files)


# 5. The tokenizer routes: TGI's /tokenize and /chat_tokenize, vLLM's /tokenize, /detokenize -

def test_tgi_tokenize_gives_each_token_with_its_characters(gateway, client_files) -> None:
    status, reply = request(gateway.url("business"), client_files, "/tokenize",
                            {"inputs": PROMPT, "parameters": {"max_new_tokens": 2}})
    assert status == 200, reply
    assert [token["id"] for token in reply] == PROMPT_IDS
    assert "".join(token["text"] for token in reply) == PROMPT
    assert all(PROMPT[token["start"]:token["stop"]] == token["text"] for token in reply)


def test_tgi_chat_tokenize_gives_the_templated_text_and_each_token_in_it(gateway,
                                                                         client_files) -> None:
    base = gateway.url("business")
    messages = [{"role": "user", "content": PROMPT}]
    status, reply = request(base, client_files, "/chat_tokenize",
                            {"model": "tgi", "messages": messages, "max_tokens": 2})
    assert status == 200, reply
    assert set(reply) == {"tokenize_response", "templated_text"}
    text, tokens = reply["templated_text"], reply["tokenize_response"]
    assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n"), text
    assert f"<|im_start|>user\n{PROMPT}<|im_end|>\n" in text
    assert all(text[token["start"]:token["stop"]] == token["text"] for token in tokens)
    assert "".join(token["text"] for token in tokens) == text
    _, vllm = request(base, client_files, "/tokenize", {"messages": messages})
    assert [token["id"] for token in tokens] == vllm["tokens"]  # the prompt Generate gets
    status, refused = request(base, client_files, "/chat_tokenize",
                              {"messages": [{"role": "narrator", "content": PROMPT}]})
    assert_tgi_error(status, refused, "messages[0].role")


def test_vllm_tokenize_of_a_prompt_and_of_messages(gateway, client_files) -> None:
    base = gateway.url("business")
    status, reply = request(base, client_files, "/tokenize", {"model": MODEL, "prompt": PROMPT})
    assert status == 200, reply
    assert (reply["count"], reply["tokens"], reply["token_strs"]) == \
        (len(PROMPT_IDS), PROMPT_IDS, None)
    _, info = request(base, client_files, "/info")
    assert reply["max_model_len"] == info["max_total_tokens"]
    status, spelled = request(base, client_files, "/tokenize",
                              {"prompt": PROMPT, "return_token_strs": True})
    assert status == 200, spelled
    assert spelled["token_strs"] == ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]
    messages = [{"role": "user", "content": PROMPT}]
    status, chat = request(base, client_files, "/tokenize", {"messages": messages})
    assert status == 200, chat
    assert chat["count"] > len(PROMPT_IDS)
    status, text = request(base, client_files, "/detokenize", {"tokens": chat["tokens"]})
    assert status == 200, text
    assert text["prompt"].startswith("<|im_start|>") and PROMPT in text["prompt"]


@pytest.mark.parametrize("body, status, param", [
    ({"messages": [{"role": "user", "content": "Hi"}], "continue_final_message": True}, 400,
     "continue_final_message"),
    ({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": 5}, 400,
     "chat_template_kwargs"),
    ({"model": "no-such-model", "prompt": "Hi"}, 404, "model"),
], ids=["server-refusal", "gateway-refusal", "unknown-model"])
def test_vllm_tokenize_errors_are_vllms_openai_errors(gateway, client_files, body: dict,
                                                      status: int, param: str | None) -> None:
    got, reply = request(gateway.url("business"), client_files, "/tokenize", body)
    assert got == status, reply
    assert set(reply["error"]) == {"message", "type", "param", "code"}
    assert (reply["error"]["param"], reply["error"]["code"]) == (param, str(status))


def test_vllm_detokenize_refuses_an_id_outside_the_vocabulary(gateway, client_files) -> None:
    status, reply = request(gateway.url("business"), client_files, "/detokenize",
                            {"tokens": [PARIS, 10**6]})
    assert status == 400, reply
    assert reply["error"]["param"] == "tokens"
    assert str(10**6) in reply["error"]["message"]
    assert "vocabulary" in reply["error"]["message"]
    status, reply = request(gateway.url("business"), client_files, "/detokenize",
                            {"tokens": [PARIS]})
    assert (status, reply) == (200, {"prompt": " Paris"})


# 6. vLLM's /version ---------------------------------------------------------------------------

def test_vllm_version_is_the_packages(gateway, client_files) -> None:
    status, reply = request(gateway.url("business"), client_files, "/version")
    assert status == 200, reply
    assert set(reply) == {"version"} and reply["version"]
    _, info = request(gateway.url("business"), client_files, "/info")
    assert reply["version"] == info["version"]  # the model server's
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    assert reply["version"] == tomllib.loads(pyproject.read_text())["project"]["version"]
