"""The gateway's OpenAI routes end to end: the real `openai` SDK (and http.client, to drop a
stream) → gateway (Tornado, mutual TLS) → gRPC server (mutual TLS) → the real model.

Runs with the other tests under tests/peers (their own pytest process: tritonclient); it
imports none of our packages but the stdlib helpers in gateway_clients.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import httpx2
import openai
import pytest
from gateway_clients import MODEL, OpenStream, connect, poll, slot_count, ssl_context

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
FRANCE = "The capital of France is"
ITALY = "The capital of Italy is"
FRANCE_IDS = [504, 3575, 282, 4649, 314]  # in SmolLM2's vocabulary
FRANCE_PROMPT_TOKENS = len(FRANCE_IDS)
PARIS, LONDON = "7042", "4528"  # " Paris" and " London" in SmolLM2's vocabulary
SLOTS_BACK_WITHIN_S = 3.0


@pytest.fixture(scope="module")
def client(gateway, client_files) -> Iterator[openai.OpenAI]:
    """The SDK over mutual TLS; no retries, so that every refusal is seen as sent."""
    http = httpx2.Client(verify=ssl_context(client_files), timeout=120)
    sdk = openai.OpenAI(base_url=gateway.url("business") + "/v1", api_key="unused",
                        http_client=http, max_retries=0)
    yield sdk
    sdk.close()


@pytest.fixture(scope="module")
def greedy_chat(client):
    return client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                          max_tokens=16)


@pytest.fixture(scope="module")
def greedy_completion(client):
    return client.completions.create(model=MODEL, prompt=FRANCE, temperature=0, max_tokens=4)


def assert_still_serving(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=1)
    assert len(reply.choices) == 1 and reply.usage.completion_tokens == 1


# Responses ----------------------------------------------------------------------------------

def test_a_response_answers_as_the_chat_completion_does(client, greedy_chat) -> None:
    """The same question, greedy, as a Responses API input gives the chat's answer."""
    response = client.responses.create(model=MODEL, input=QUESTION[0]["content"], temperature=0,
                                       max_output_tokens=16)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.model == MODEL
    assert response.output_text == greedy_chat.choices[0].message.content
    [item] = response.output
    assert (item.type, item.role, item.status) == ("message", "assistant", response.status)
    expected = "incomplete" if greedy_chat.choices[0].finish_reason == "length" else "completed"
    assert response.status == expected
    assert response.usage.input_tokens == greedy_chat.usage.prompt_tokens
    assert response.usage.output_tokens == greedy_chat.usage.completion_tokens
    assert response.store is False


def test_a_streamed_response_accumulates_to_the_same_answer(client, greedy_chat) -> None:
    """The SDK's stream helper checks the events' order and identities as it accumulates."""
    with client.responses.stream(model=MODEL, input=QUESTION, temperature=0,
                                 max_output_tokens=16) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == greedy_chat.choices[0].message.content
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert kinds.count("response.output_text.delta") >= 2


def test_a_response_cut_by_max_output_tokens_is_incomplete(client) -> None:
    response = client.responses.create(model=MODEL, input=QUESTION[0]["content"],
                                       temperature=0, max_output_tokens=2)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 2


def test_a_response_includes_its_tokens_logprobs_when_asked(client) -> None:
    response = client.responses.create(model=MODEL, input=QUESTION[0]["content"], temperature=0,
                                       max_output_tokens=8, top_logprobs=2,
                                       include=["message.output_text.logprobs"])
    [part] = response.output[0].content
    assert "".join(entry.token for entry in part.logprobs) == response.output_text
    for entry in part.logprobs:
        assert len(entry.top_logprobs) == 2 and entry.logprob <= 0
        # Greedy: the chosen token is the most likely.
        assert entry.logprob >= max(top.logprob for top in entry.top_logprobs) - 1e-4


@pytest.mark.parametrize("action", ["retrieve", "delete", "cancel"])
def test_no_stored_response_is_found(client, action: str) -> None:
    with pytest.raises(openai.NotFoundError) as refused:
        getattr(client.responses, action)("resp_1")
    assert refused.value.body["param"] == "response_id"
    assert_still_serving(client)


def test_a_previous_response_id_is_not_found(client) -> None:
    with pytest.raises(openai.NotFoundError) as refused:
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_1")
    assert refused.value.body["param"] == "previous_response_id"
    assert_still_serving(client)


# Chat ----------------------------------------------------------------------------------------

def test_chat_completion_answers_paris(greedy_chat) -> None:
    assert greedy_chat.object == "chat.completion"
    assert greedy_chat.model == MODEL
    assert greedy_chat.id.startswith("chatcmpl-")
    [choice] = greedy_chat.choices
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert choice.logprobs is None
    usage = greedy_chat.usage
    assert usage.prompt_tokens > 0 and 1 <= usage.completion_tokens <= 16
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_a_chat_answer_has_the_fields_openais_spec_requires(client) -> None:
    """A string system_fingerprint (TGI's spec requires it too) and message.refusal (null)."""
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=QUESTION,
                                                           max_tokens=2)
    document = raw.http_response.json()
    assert isinstance(document["system_fingerprint"], str) and document["system_fingerprint"]
    message = document["choices"][0]["message"]
    assert "refusal" in message and message["refusal"] is None


def test_an_assistants_started_answer_is_continued(client, greedy_chat) -> None:
    """vLLM's continue_final_message: the answer goes on from the last message's text, here
    the start of the answer the model gives by itself; template variables the template does
    not read change nothing (SmolLM2's does not read Qwen3's enable_thinking)."""
    started = [*QUESTION, {"role": "assistant", "content": FRANCE}]
    reply = client.chat.completions.create(
        model=MODEL, messages=started, temperature=0, max_tokens=1,
        extra_body={"add_generation_prompt": False, "continue_final_message": True,
                    "chat_template_kwargs": {"enable_thinking": False}})
    assert reply.choices[0].message.content == " Paris"
    assert reply.usage.prompt_tokens > greedy_chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError, match="continue_final_message"):
        client.chat.completions.create(model=MODEL, messages=started, max_tokens=1,
                                       extra_body={"continue_final_message": True})


def test_a_request_of_megabytes_within_the_body_limit_is_served(client) -> None:
    """Past gRPC's default message size (4 MiB) between the gateway and the server; it was
    failed as overloaded (503), which clients retry."""
    reply = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=1,
        extra_body={"chat_template_kwargs": {"unused": "x" * 5_000_000}})
    assert reply.usage.completion_tokens == 1


def test_response_format_json_schema_gives_json_that_follows_it(client) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "is_capital": {"type": "boolean"}},
              "required": ["city", "is_capital"]}
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "The capital of France, as JSON."}],
        temperature=0, max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "city",
                                                                "schema": schema}})
    answer = json.loads(reply.choices[0].message.content)
    assert set(answer) == {"city", "is_capital"} and "Paris" in answer["city"]
    assert reply.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4,
                                       response_format={"type": "json_schema"})
    assert info.value.body["param"] == "response_format.json_schema"


def test_streamed_chat_yields_the_same_text_and_a_usage_chunk(client, greedy_chat) -> None:
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=16, stream=True,
        stream_options={"include_usage": True}))
    *content_chunks, last = chunks
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1
    # A string in every chunk, as TGI's spec requires and OpenAI's types it.
    assert {type(chunk.system_fingerprint) for chunk in chunks} == {str}
    assert content_chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.usage is None and [c.index for c in chunk.choices] == [0]
               for chunk in content_chunks)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in content_chunks)
    assert text == greedy_chat.choices[0].message.content
    reasons = [chunk.choices[0].finish_reason for chunk in content_chunks]
    assert reasons[-1] == greedy_chat.choices[0].finish_reason
    assert reasons[:-1] == [None] * (len(reasons) - 1)
    # The usage chunk: no choices, the whole request's counts.
    assert last.choices == []
    usage = last.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert (usage.prompt_tokens, usage.completion_tokens) == \
        (greedy_chat.usage.prompt_tokens, greedy_chat.usage.completion_tokens)



def test_continuous_usage_stats_count_the_tokens_so_far_in_every_chunk(client, greedy_chat
                                                                        ) -> None:
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=16, stream=True,
        extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}}))
    *content_chunks, last = chunks
    counts = [chunk.usage.completion_tokens for chunk in content_chunks]
    # The role's chunk comes before the first token, as vLLM's.
    assert counts == sorted(counts) and counts[:2] == [0, 1]
    assert counts[-1] == last.usage.completion_tokens == greedy_chat.usage.completion_tokens
    assert {chunk.usage.prompt_tokens for chunk in chunks} == {greedy_chat.usage.prompt_tokens}


def test_tgis_documented_model_name_means_the_served_model(client, greedy_chat) -> None:
    """TGI's documentation points the OpenAI SDK at TGI with model="tgi"."""
    reply = client.chat.completions.create(model="tgi", messages=QUESTION, temperature=0,
                                           max_tokens=16)
    assert reply.choices[0].message.content == greedy_chat.choices[0].message.content
    assert reply.model == MODEL


def test_an_unknown_model_name_is_refused_naming_it(client) -> None:
    with pytest.raises(openai.NotFoundError, match="no-such-model") as refused:
        client.chat.completions.create(model="no-such-model", messages=QUESTION, max_tokens=1)
    assert refused.value.param == "model"
    assert_still_serving(client)


def test_models_list_and_retrieve(client) -> None:
    models = client.models.list()
    assert MODEL in [model.id for model in models.data]
    model = client.models.retrieve(MODEL)
    assert (model.id, model.object) == (MODEL, "model")
    # vLLM's additions, which clients read for the context length: maxSeqLen by default.
    assert (model.root, model.parent, model.max_model_len) == (MODEL, None, 2560)
    assert models.data[0].max_model_len == 2560
    with pytest.raises(openai.NotFoundError) as refused:
        client.models.retrieve("no-such-model")
    assert refused.value.status_code == 404


def test_n_2_with_a_seed_gives_two_reproducible_choices(client) -> None:
    def ask():
        return client.chat.completions.create(model=MODEL, messages=QUESTION, n=2, seed=1234,
                                              temperature=0.8, max_tokens=6)

    first = ask()
    assert [choice.index for choice in first.choices] == [0, 1]
    assert all(choice.message.content and choice.finish_reason in ("stop", "length")
               for choice in first.choices)
    assert 2 <= first.usage.completion_tokens <= 12
    again = ask()
    assert [c.message.content for c in again.choices] == [c.message.content for c in first.choices]


@pytest.mark.parametrize("seed", [0, -5])
def test_any_int64_seed_but_minus_1_reproduces_its_sample(client, seed: int) -> None:
    """vLLM's seed is an int64: 0 (a common client default) and negative seeds are seeds."""
    def complete() -> str:
        return client.completions.create(model=MODEL, prompt=FRANCE, max_tokens=4,
                                         temperature=1.0, seed=seed).choices[0].text

    def chat() -> str:
        return client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4,
                                              temperature=1.0, seed=seed
                                              ).choices[0].message.content

    first = complete()
    assert first and complete() == first
    first = chat()
    assert first and chat() == first


def test_chat_seed_minus_1_is_a_random_seed_as_vllms(client) -> None:
    story = [{"role": "user", "content": "Tell me a story."}]
    answers = {client.chat.completions.create(model=MODEL, messages=story, max_tokens=8,
                                              temperature=1.5, seed=-1).choices[0].message.content
               for _ in range(5)}
    assert len(answers) > 1


def test_chat_logprobs_are_per_token_and_spell_the_content(client) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                           max_tokens=6, logprobs=True, top_logprobs=2)
    [choice] = reply.choices
    assert choice.finish_reason == "length"  # "The capital of France is Paris." is 7 tokens
    entries = choice.logprobs.content
    assert len(entries) == reply.usage.completion_tokens == 6
    assert "".join(entry.token for entry in entries) == choice.message.content
    for entry in entries:
        assert entry.logprob <= 0
        assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)


def test_chat_logprobs_of_a_finished_answer_spell_the_content(client) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                           max_tokens=16, logprobs=True, top_logprobs=2)
    [choice] = reply.choices
    assert choice.finish_reason == "stop"
    assert "".join(entry.token for entry in choice.logprobs.content) == choice.message.content


# Completions ---------------------------------------------------------------------------------

def test_completion_of_a_string_prompt(greedy_completion) -> None:
    assert greedy_completion.object == "text_completion"
    assert greedy_completion.id.startswith("cmpl-")
    [choice] = greedy_completion.choices
    assert choice.index == 0
    assert "Paris" in choice.text
    assert not choice.text.startswith(FRANCE)
    usage = greedy_completion.usage
    assert usage.prompt_tokens == FRANCE_PROMPT_TOKENS
    assert 1 <= usage.completion_tokens <= 4
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_completion_of_two_prompts_answers_each_in_order(client, greedy_completion) -> None:
    reply = client.completions.create(model=MODEL, prompt=[FRANCE, ITALY], temperature=0,
                                      max_tokens=4)
    assert [choice.index for choice in reply.choices] == [0, 1]
    france, italy = reply.choices
    assert france.text == greedy_completion.choices[0].text
    assert "Rome" in italy.text
    assert reply.usage.prompt_tokens == 2 * FRANCE_PROMPT_TOKENS  # both are 5 tokens


def test_min_p_1_samples_only_the_most_likely_token(client, greedy_chat) -> None:
    """vLLM's min_p: at 1 only the most likely token is left to draw, at any temperature."""
    for seed in (1, 2):
        sampled = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=1.5,
                                                 max_tokens=16, seed=seed,
                                                 extra_body={"min_p": 1.0})
        assert sampled.choices[0].message.content == greedy_chat.choices[0].message.content


def test_vllms_token_extras(client) -> None:
    def complete(**extra_body):
        return client.completions.create(model=MODEL, prompt=FRANCE, temperature=0,
                                         max_tokens=3, extra_body=extra_body)
    assert complete(allowed_token_ids=[int(LONDON)]).choices[0].text == " London London London"
    assert complete(truncate_prompt_tokens=2).usage.prompt_tokens == 2
    assert complete(stop=[" Paris"]).choices[0].text == ""
    assert complete(stop=[" Paris"], include_stop_str_in_output=True).choices[0].text == " Paris"
    past_the_turn = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=24,
        extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert "<|im_end|>" in past_the_turn.choices[0].message.content


def test_logit_bias_bans_and_forces_tokens(client, greedy_completion) -> None:
    assert greedy_completion.choices[0].text.startswith(" Paris")
    banned = client.completions.create(model=MODEL, prompt=FRANCE, temperature=0, max_tokens=4,
                                       logit_bias={PARIS: -100})
    assert "Paris" not in banned.choices[0].text
    forced = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                            max_tokens=3, logit_bias={LONDON: 100})
    assert forced.choices[0].message.content == " London London London"


def test_logit_bias_out_of_the_vocabulary_or_range_is_refused_naming_it(client) -> None:
    for logit_bias in ({"49152": 1}, {PARIS: 101}, {"Paris": 1}):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=MODEL, prompt=FRANCE, max_tokens=2,
                                      logit_bias=logit_bias)
        assert_openai_error(refused, "logit_bias")
    assert_still_serving(client)


def test_completion_with_echo_starts_with_the_prompt(client, greedy_completion) -> None:
    reply = client.completions.create(model=MODEL, prompt=FRANCE, temperature=0, max_tokens=4,
                                      echo=True)
    assert reply.choices[0].text == FRANCE + greedy_completion.choices[0].text


def test_echo_with_logprobs_scores_the_prompt_then_the_completion(client, greedy_completion
                                                                  ) -> None:
    """As vLLM answers it (lm-evaluation-harness scores texts so): the prompt's tokens lead
    the logprobs, the first without one."""
    reply = client.completions.create(model=MODEL, prompt=FRANCE, temperature=0, max_tokens=4,
                                      echo=True, logprobs=1)
    [choice] = reply.choices
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == FRANCE_PROMPT_TOKENS + reply.usage.completion_tokens
    assert "".join(logprobs.tokens) == choice.text == FRANCE + greedy_completion.choices[0].text
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(logprob < 0 for logprob in logprobs.token_logprobs[1:])
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:i]))
                                    for i in range(len(logprobs.tokens))]
    streamed = list(client.completions.create(model=MODEL, prompt=FRANCE, temperature=0,
                                              max_tokens=4, echo=True, logprobs=1,
                                              stream=True))
    tokens = [token for chunk in streamed if chunk.choices[0].logprobs
              for token in chunk.choices[0].logprobs.tokens]
    assert tokens == logprobs.tokens
    assert "".join(chunk.choices[0].text for chunk in streamed) == choice.text


def test_echo_tells_the_greedy_continuation_from_another(client) -> None:
    """lm-evaluation-harness's test: a continuation is greedy where each of its tokens' logprob
    is the highest of its position's top_logprobs."""
    def continuation(word: str) -> tuple[float, dict[str, float]]:
        reply = client.completions.create(model=MODEL, prompt=FRANCE + word, max_tokens=1,
                                          temperature=0, echo=True, logprobs=1)
        logprobs = reply.choices[0].logprobs
        assert logprobs.tokens[FRANCE_PROMPT_TOKENS] == word
        return (logprobs.token_logprobs[FRANCE_PROMPT_TOKENS],
                logprobs.top_logprobs[FRANCE_PROMPT_TOKENS])

    paris, paris_top = continuation(" Paris")
    assert paris == max(paris_top.values()) and set(paris_top) == {" Paris"}
    berlin, berlin_top = continuation(" Berlin")
    assert berlin < max(berlin_top.values()) == berlin_top[" Paris"] == pytest.approx(paris)
    assert set(berlin_top) == {" Paris", " Berlin"}


def test_every_streamed_choice_echoes_a_token_id_prompt(client) -> None:
    """The server computes the prompt's tokens once, for one of the n sequences; every
    choice's stream still starts with them."""
    streamed = list(client.completions.create(model=MODEL, prompt=FRANCE_IDS, max_tokens=3,
                                              n=3, seed=5, echo=True, logprobs=0, stream=True))
    for index in range(3):
        chunks = [chunk.choices[0] for chunk in streamed if chunk.choices[0].index == index]
        assert "".join(choice.text for choice in chunks).startswith(FRANCE)
        tokens = [token for choice in chunks for token in choice.logprobs.tokens]
        assert "".join(tokens[:FRANCE_PROMPT_TOKENS]) == FRANCE


def test_echo_of_no_tokens_scores_the_prompt_alone(client) -> None:
    for stream in (False, True):
        chunks = client.completions.create(model=MODEL, prompt=ITALY, max_tokens=0, echo=True,
                                           logprobs=0, stream=stream)
        [choice] = chunks.choices if not stream else [
            chunk.choices[0] for chunk in chunks if chunk.choices[0].logprobs]
        assert choice.text == ITALY
        assert "".join(choice.logprobs.tokens) == ITALY
        assert choice.logprobs.token_logprobs[0] is None
        assert len(choice.logprobs.token_logprobs) == FRANCE_PROMPT_TOKENS
    with pytest.raises(openai.BadRequestError) as refused:  # no tokens and no echo
        client.completions.create(model=MODEL, prompt=ITALY, max_tokens=0)
    assert_openai_error(refused, "max_tokens")


def test_streamed_completion_yields_the_same_text(client, greedy_completion) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt=FRANCE, temperature=0,
                                            max_tokens=4, stream=True))
    assert all(chunk.object == "text_completion" for chunk in chunks)
    assert "".join(chunk.choices[0].text for chunk in chunks) == greedy_completion.choices[0].text
    assert chunks[-1].choices[0].finish_reason == greedy_completion.choices[0].finish_reason


def test_completion_suffix_is_refused(client) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=FRANCE, max_tokens=2, suffix=" and more.")
    assert refused.value.status_code == 400
    assert refused.value.param == "suffix"
    assert "suffix" in refused.value.message
    assert_still_serving(client)


# Validation ----------------------------------------------------------------------------------

def assert_openai_error(refused: pytest.ExceptionInfo, param: str) -> None:
    error = refused.value
    assert error.status_code == 400
    document = error.response.json()
    assert set(document) == {"error"}
    assert document["error"]["type"] == "invalid_request_error"
    # A string, as OpenAI's spec types it (typed clients decode it as one).
    assert document["error"]["code"] == "400" == error.code
    assert document["error"]["param"] == param == error.param
    assert param in document["error"]["message"]


def test_an_unknown_message_role_is_refused_naming_it(client) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, max_tokens=2,
                                       messages=[{"role": "wizard", "content": "Hi"}])
    assert_openai_error(refused, "messages[0].role")
    assert_still_serving(client)


def test_a_negative_temperature_is_refused_naming_it(client) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2,
                                       temperature=-1)
    assert_openai_error(refused, "temperature")
    assert_still_serving(client)


def create(client: openai.OpenAI, route: str, **fields):
    if route == "chat":
        return client.chat.completions.create(model=MODEL, messages=QUESTION, **fields)
    return client.completions.create(model=MODEL, prompt=FRANCE, **fields)


@pytest.mark.parametrize(("route", "field"), [("chat", "max_tokens"),
                                              ("chat", "max_completion_tokens"),
                                              ("completions", "max_tokens")])
def test_a_negative_max_tokens_is_refused_naming_the_field_sent(client, route, field) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, route, **{field: -1})
    assert_openai_error(refused, field)


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_max_tokens_0_is_refused(client, route) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, route, max_tokens=0, temperature=0)
    assert_openai_error(refused, "max_tokens")


def test_completion_logprobs_out_of_range_is_refused_naming_logprobs(client) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=FRANCE, max_tokens=2, logprobs=30)
    assert_openai_error(refused, "logprobs")


# A client gone mid-stream --------------------------------------------------------------------

@contextlib.contextmanager
def open_chat_stream(gateway, client_files, body: dict) -> Iterator[OpenStream]:
    connection = connect(gateway.url("business"), client_files)
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(body),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        assert response.getheader("Content-Type").startswith("text/event-stream")
        yield OpenStream(connection, response)
    finally:
        connection.close()


def test_dropping_a_chat_stream_frees_its_slot(gateway, client_files) -> None:
    idle = slot_count(gateway, client_files)
    assert idle["free_slots"] == idle["total_slots"] > 0
    body = {"model": MODEL, "stream": True, "max_tokens": 1000, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Write a long story about a dragon."}]}
    with open_chat_stream(gateway, client_files, body) as stream:
        events = stream.events()
        first, second = next(events), next(events)
        assert first["choices"][0]["delta"]["role"] == "assistant"
        assert second["choices"][0]["finish_reason"] is None
        assert slot_count(gateway, client_files)["free_slots"] == idle["total_slots"] - 1
        stream.drop()
    final, elapsed = poll(lambda: slot_count(gateway, client_files),
                          lambda now: now["free_slots"] == now["total_slots"],
                          deadline_s=SLOTS_BACK_WITHIN_S)
    assert final["free_slots"] == final["total_slots"], f"after {elapsed:.2f} s: {final}"
    assert final == idle


@pytest.mark.parametrize("create", ["chat", "responses"])
def test_auto_tool_choice_without_the_servers_parser_is_refused_as_vllm_refuses_it(
        client, create: str) -> None:
    """This module's server runs without --enable-auto-tool-choice and --tool-call-parser:
    "auto" with tools (the default with tools) gets vLLM's 400, naming tool_choice, on chat
    completions and the Responses API alike."""
    tool = {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    with pytest.raises(openai.BadRequestError) as refused:
        if create == "chat":
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4,
                                           tools=[{"type": "function", "function": tool}])
        else:
            client.responses.create(model=MODEL, input="Hi", max_output_tokens=4,
                                    tools=[{"type": "function", **tool}])
    error = refused.value.body
    assert error["param"] == "tool_choice"
    assert "requires --enable-auto-tool-choice and --tool-call-parser" in error["message"]
    assert_still_serving(client)
