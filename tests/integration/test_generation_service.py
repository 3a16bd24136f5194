"""End to end: `switchboard.v1.Generation/Generate`, `Management` and KServe's `RepositoryIndex`,
stream errors and unsupported RPCs against the real server process and the real SmolLM2 model, over mutual TLS, as a client sees
them (sync gRPC and our generated stubs)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from switchboard.gateway.protocols.parameters import to_parameter
from switchboard.process import ServerProcess
from switchboard.proto import generation_fields
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import grpc_service_pb2_grpc as pb_grpc
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto import switchboard_pb2_grpc as sb_grpc

MODEL = "smollm2"
QUESTION = "What is the capital of France?"
COMPLETION_PROMPT = "The capital of France is"
CALL_TIMEOUT_S = 60
SLOTS_FREED_WITHIN_S = 5.0
LOGGED_WITHIN_S = 5.0
UINT64_MAX = 2**64 - 1


# --- plumbing ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def channel(grpc_server, client_files) -> Iterator[grpc.Channel]:
    with secure_channel(grpc_server, client_files) as channel:
        yield channel


def secure_channel(server: ServerProcess, client_files) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(root_certificates=client_files.ca.read_bytes(),
                                               private_key=client_files.key.read_bytes(),
                                               certificate_chain=client_files.cert.read_bytes())
    channel = grpc.secure_channel(server.address, credentials)
    grpc.channel_ready_future(channel).result(timeout=30)
    return channel


@pytest.fixture(scope="module")
def generation(channel) -> sb_grpc.GenerationStub:
    return sb_grpc.GenerationStub(channel)


@pytest.fixture(scope="module")
def deterministic(pki, client_files) -> Iterator[sb_grpc.GenerationStub]:
    """A server of its own with --enable-deterministic-inference, for the tests that compare
    a seeded sequence with itself run in another batch: by default a seed reproduces the
    sampling, and the logits may differ in their last bits with what else a step computes
    (docs/engine.md#deterministic-inference)."""
    server = ServerProcess("--tls-dir", str(pki.folder), "--enable-deterministic-inference")
    try:
        server.wait_ready()
        with secure_channel(server, client_files) as channel:
            yield sb_grpc.GenerationStub(channel)
    finally:
        assert server.stop() == 0, server.log_text()


@pytest.fixture(scope="module")
def management(channel) -> sb_grpc.ManagementStub:
    return sb_grpc.ManagementStub(channel)


@pytest.fixture(scope="module")
def inference(channel) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(channel)


def chat(*messages: tuple[str, str]) -> sb.ChatMessages:
    return sb.ChatMessages(messages=[sb.ChatMessage(role=role, content=content)
                                     for role, content in messages])


def request(*, text: str | None = None, token_ids: list[int] | None = None,
            messages: sb.ChatMessages | None = None, model_name: str = "", id: str = "",
            **parameters: object) -> sb.GenerateRequest:
    message = sb.GenerateRequest(model_name=model_name, id=id)
    generation_fields.fill(message, parameters)
    if text is not None:
        message.text = text
    if token_ids is not None:
        message.token_ids.ids.extend(token_ids)
    if messages is not None:
        message.messages.CopyFrom(messages)
    return message


def generate(stub: sb_grpc.GenerationStub, message: sb.GenerateRequest
             ) -> list[sb.GenerateResponse]:
    return list(stub.Generate(message, timeout=CALL_TIMEOUT_S))


def of_index(responses: list[sb.GenerateResponse], index: int) -> list[sb.GenerateResponse]:
    return [response for response in responses if response.index == index]


def token_ids(responses: list[sb.GenerateResponse]) -> list[int]:
    return [token.id for response in responses for token in response.tokens]


def text_of(responses: list[sb.GenerateResponse]) -> str:
    return "".join(response.text for response in responses)


def rpc_error(stub: sb_grpc.GenerationStub, message: sb.GenerateRequest) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        generate(stub, message)
    return raised.value


def field_violations(error: grpc.RpcError) -> list[tuple[str, str]]:
    """The (field, description) pairs of the google.rpc.BadRequest in the error's status."""
    bad_request = error_details_pb2.BadRequest()
    status = rpc_status.from_call(error)
    assert status is not None and status.details[0].Unpack(bad_request), error.details()
    return [(violation.field, violation.description)
            for violation in bad_request.field_violations]


def assert_still_serves(stub: sb_grpc.GenerationStub) -> None:
    responses = generate(stub, request(text=COMPLETION_PROMPT, do_sample=False, max_new_tokens=2))
    assert responses[-1].finish_reason == "length"
    assert responses[-1].generated_tokens == 2


def assert_one_last_response(responses: list[sb.GenerateResponse]) -> None:
    """A sequence's responses: finish_reason set on the last one only."""
    assert responses, "the sequence has no response"
    assert [bool(response.finish_reason) for response in responses] == \
        [False] * (len(responses) - 1) + [True]


def slot_count(management: sb_grpc.ManagementStub) -> sb.GetSlotCountResponse:
    return management.GetSlotCount(sb.GetSlotCountRequest(model_name=MODEL), timeout=10)


def wait_for_all_slots_free(management: sb_grpc.ManagementStub) -> sb.GetSlotCountResponse:
    deadline = time.monotonic() + SLOTS_FREED_WITHIN_S
    while True:
        slots = slot_count(management)
        if slots.free_slots == slots.total_slots or time.monotonic() > deadline:
            return slots
        time.sleep(0.05)


def logged(server, text: str) -> bool:
    """Whether the server's log shows `text` within LOGGED_WITHIN_S (its output is read by
    another thread)."""
    deadline = time.monotonic() + LOGGED_WITHIN_S
    while text not in server.log_text():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(scope="module")
def question_tokens(generation) -> list[sb.Token]:
    """The bare question as a text prompt, tokenized by the server (prompt_logprobs)."""
    responses = generate(generation, request(text=QUESTION, do_sample=False, max_new_tokens=1,
                                             prompt_logprobs=True))
    return list(responses[0].prompt)


@pytest.fixture(scope="module")
def chat_answer(generation) -> list[sb.GenerateResponse]:
    return generate(generation, request(messages=chat(("user", QUESTION)), do_sample=False,
                                        max_new_tokens=24))


# --- chat messages -----------------------------------------------------------------------------

def test_chat_greedy_answer_names_paris_and_ends_on_end_of_turn(chat_answer) -> None:
    assert "Paris" in text_of(chat_answer)
    assert_one_last_response(chat_answer)
    assert {response.index for response in chat_answer} == {0}
    last = chat_answer[-1]
    # Greedy: the short answer ends with the end-of-turn token well before 24 tokens.
    assert last.finish_reason == "eos_token"
    assert last.generated_tokens == len(token_ids(chat_answer)) < 24
    end_of_turn = last.tokens[-1]
    assert end_of_turn.special
    assert end_of_turn.text == "<|im_end|>"
    answer_tokens = [token for response in chat_answer for token in response.tokens]
    assert not any(token.special for token in answer_tokens[:-1])


def test_chat_tokens_carry_id_and_text_and_texts_concatenate_to_the_answer(chat_answer) -> None:
    answer = text_of(chat_answer)
    assert answer.strip(), "empty answer"
    for response in chat_answer:
        assert response.tokens, "a response without a token"
        for token in response.tokens:
            assert token.text, f"token {token.id} has no text"
    ordinary = "".join(token.text for response in chat_answer for token in response.tokens
                       if not token.special)
    assert ordinary == answer
    assert "<|im_end|>" not in answer
    # Ids and texts agree: one text, one id, wherever it occurs.
    by_text: dict[str, int] = {}
    for response in chat_answer:
        for token in response.tokens:
            assert by_text.setdefault(token.text, token.id) == token.id


def test_chat_prompt_is_the_template_not_the_bare_question(chat_answer, question_tokens) -> None:
    prompt_tokens = {response.prompt_tokens for response in chat_answer}
    assert len(prompt_tokens) == 1
    # SmolLM2's template adds a default system prompt and the role markers.
    assert prompt_tokens.pop() > len(question_tokens) + 10


def test_chat_with_system_message_is_rendered(generation) -> None:
    responses = generate(generation, request(
        messages=chat(("system", "Answer with one word."), ("user", QUESTION)),
        do_sample=False, max_new_tokens=8, prompt_logprobs=True))
    prompt = responses[0].prompt
    prompt_text = "".join(token.text for token in prompt)
    assert len(prompt) == responses[0].prompt_tokens
    assert (prompt[0].text, prompt[0].special) == ("<|im_start|>", True)
    assert not prompt[0].HasField("logprob")
    assert "<|im_start|>system\nAnswer with one word.<|im_end|>" in prompt_text
    assert f"<|im_start|>user\n{QUESTION}<|im_end|>" in prompt_text
    assert prompt_text.endswith("<|im_start|>assistant\n")
    assert "Paris" in text_of(responses)


# --- prompts -----------------------------------------------------------------------------------

def test_text_and_token_ids_prompts_give_the_same_greedy_output(generation) -> None:
    by_text = generate(generation, request(text=COMPLETION_PROMPT, do_sample=False,
                                           max_new_tokens=8, prompt_logprobs=True))
    prompt_ids = [token.id for token in by_text[0].prompt]
    assert len(prompt_ids) == by_text[0].prompt_tokens > 1
    by_ids = generate(generation, request(token_ids=prompt_ids, do_sample=False, max_new_tokens=8))
    assert token_ids(by_ids) == token_ids(by_text)
    assert len(token_ids(by_ids)) == 8
    assert text_of(by_ids) == text_of(by_text)
    assert "Paris" in text_of(by_ids)
    assert by_ids[-1].prompt_tokens == len(prompt_ids)
    assert by_ids[-1].finish_reason == by_text[-1].finish_reason == "length"


def test_stop_strings_as_a_json_array_end_the_text_before_them(generation) -> None:
    responses = generate(generation, request(messages=chat(("user", QUESTION)), do_sample=False,
                                             max_new_tokens=24, stop=["Paris", "Berlin"]))
    assert_one_last_response(responses)
    assert responses[-1].finish_reason == "stop_sequence"
    text = text_of(responses)
    assert "Paris" not in text
    assert text.startswith("The capital of France is")
    # The token that completed the stop string was generated (and is reported) all the same.
    assert responses[-1].generated_tokens == len(token_ids(responses))
    assert "".join(t.text for r in responses for t in r.tokens).endswith(" Paris")


# --- n sequences -------------------------------------------------------------------------------

STORY = chat(("user", "Tell me a story about a dragon."))


def test_n_sampled_sequences_with_a_seed_are_reproducible(deterministic) -> None:
    message = request(messages=STORY, n=2, do_sample=True, seed=1234, temperature=1.0,
                      max_new_tokens=8)
    first, second = generate(deterministic, message), generate(deterministic, message)
    assert {response.index for response in first} == {0, 1}
    for index in (0, 1):
        sequence = of_index(first, index)
        assert_one_last_response(sequence)
        assert sequence[-1].finish_reason in ("length", "eos_token")
        assert sequence[-1].generated_tokens == len(token_ids(sequence)) > 0
        again = of_index(second, index)
        assert token_ids(again) == token_ids(sequence)
        assert text_of(again) == text_of(sequence)
        assert again[-1].seed == sequence[-1].seed
    # Two sequences, not one sent twice: their seeds (and with them their samples) differ.
    assert of_index(first, 0)[-1].seed == 1234
    assert of_index(first, 1)[-1].seed != 1234
    assert token_ids(of_index(first, 0)) != token_ids(of_index(first, 1))


def test_a_sequence_seed_sent_back_reproduces_that_sequence(deterministic) -> None:
    both = generate(deterministic, request(messages=STORY, n=2, do_sample=True,
                                           temperature=1.0, max_new_tokens=6))
    second = of_index(both, 1)
    # A drawn seed is any uint64, as the request's seed field.
    message = request(messages=STORY, do_sample=True, temperature=1.0, max_new_tokens=6,
                      seed=second[-1].seed)
    alone = generate(deterministic, message)
    assert {response.index for response in alone} == {0}
    assert token_ids(alone) == token_ids(second)
    assert alone[-1].seed == second[-1].seed


def test_the_largest_seed_works_for_every_sequence(deterministic) -> None:
    message = request(messages=STORY, n=2, do_sample=True, temperature=1.0, max_new_tokens=4,
                      seed=UINT64_MAX)
    first, second = generate(deterministic, message), generate(deterministic, message)
    seeds = [of_index(first, index)[-1].seed for index in (0, 1)]
    assert seeds[0] == UINT64_MAX
    assert seeds[1] == 0  # seed + 1, within the uint64 range
    for index in (0, 1):
        assert_one_last_response(of_index(first, index))
        assert token_ids(of_index(second, index)) == token_ids(of_index(first, index))


def test_best_of_answers_n_sequences(generation) -> None:
    responses = generate(generation, request(messages=chat(("user", QUESTION)), n=2, best_of=3,
                                             do_sample=True, seed=7, max_new_tokens=6))
    assert {response.index for response in responses} == {0, 1}
    for index in (0, 1):
        sequence = of_index(responses, index)
        assert_one_last_response(sequence)
        assert sequence[-1].generated_tokens == len(token_ids(sequence)) > 0
        assert all(not token.HasField("logprob") for token in sequence[-1].tokens)


def test_n_sequences_with_logprobs_and_the_prompt_once(generation) -> None:
    responses = generate(generation, request(messages=chat(("user", QUESTION)), n=2,
                                             do_sample=True, seed=5, max_new_tokens=3,
                                             logprobs=True, top_logprobs=2, prompt_logprobs=True))
    assert {response.index for response in responses} == {0, 1}
    for response in responses:
        for token in response.tokens:
            assert token.HasField("logprob") and token.logprob <= 0.0
            assert len(token.top) == 2
    # The prompt is the request's, the same for every sequence: it comes once, on the first
    # response of sequence 0 (the gateway adds up `prompt` across all responses).
    carrying = [response for response in responses if response.prompt]
    assert carrying == [of_index(responses, 0)[0]]
    assert len(carrying[0].prompt) == carrying[0].prompt_tokens


# --- log-probabilities -------------------------------------------------------------------------

def test_logprobs_with_top_alternatives(generation) -> None:
    responses = generate(generation, request(text=COMPLETION_PROMPT, do_sample=False,
                                             max_new_tokens=6, logprobs=True, top_logprobs=3))
    tokens = [token for response in responses for token in response.tokens]
    assert len(tokens) == 6
    for token in tokens:
        assert token.HasField("logprob")
        assert token.logprob <= 0.0
        assert len(token.top) == 3
        values = [alternative.logprob for alternative in token.top]
        assert values == sorted(values, reverse=True)
        assert all(alternative.HasField("logprob") and alternative.logprob <= 0.0
                   for alternative in token.top)
        assert all(alternative.text for alternative in token.top)
        assert len({alternative.id for alternative in token.top}) == 3
        # Greedy: the chosen token is the best alternative.
        assert token.top[0].id == token.id
        assert token.top[0].text == token.text
        assert token.top[0].logprob == pytest.approx(token.logprob, abs=1e-4)


def test_without_logprobs_tokens_have_none(generation) -> None:
    responses = generate(generation, request(text=COMPLETION_PROMPT, do_sample=False,
                                             max_new_tokens=4))
    tokens = [token for response in responses for token in response.tokens]
    assert len(tokens) == 4
    for token in tokens:
        assert not token.HasField("logprob")
        assert not token.top
    assert not any(response.prompt for response in responses)


def test_prompt_logprobs_on_the_first_response_only(generation) -> None:
    responses = generate(generation, request(text=COMPLETION_PROMPT, do_sample=False,
                                             max_new_tokens=3, prompt_logprobs=True))
    assert len(responses) == 3
    prompt = list(responses[0].prompt)
    assert len(prompt) == responses[0].prompt_tokens > 1
    assert "".join(token.text for token in prompt) == COMPLETION_PROMPT
    assert not prompt[0].HasField("logprob")
    for token in prompt[1:]:
        assert token.HasField("logprob")
        assert token.logprob <= 0.0
    assert all(not response.prompt for response in responses[1:])


# --- errors ------------------------------------------------------------------------------------

def empty_messages() -> sb.GenerateRequest:
    message = request(max_new_tokens=2)
    message.messages.SetInParent()
    return message


def empty_token_ids() -> sb.GenerateRequest:
    message = request(max_new_tokens=2)
    message.token_ids.SetInParent()
    return message


INVALID_REQUESTS = {
    "unknown role": (lambda: request(messages=chat(("wizard", QUESTION)), max_new_tokens=2),
                     "messages[0].role"),
    "unknown role of a later message": (
        lambda: request(messages=chat(("user", QUESTION), ("robot", "Paris")), max_new_tokens=2),
        "messages[1].role"),
    "no message": (empty_messages, "messages"),
    "no prompt": (lambda: request(max_new_tokens=2), "prompt"),
    "empty text": (lambda: request(text="", max_new_tokens=2), "prompt"),
    "no token id": (empty_token_ids, "prompt"),
    "token id outside the vocabulary": (lambda: request(token_ids=[1, 10**6]), "prompt"),
    "bad client id": (lambda: request(text=COMPLETION_PROMPT, id="bad id!", max_new_tokens=2),
                      "id"),
    "top_logprobs out of range": (
        lambda: request(text=COMPLETION_PROMPT, logprobs=True, top_logprobs=21), "top_logprobs"),
    "top_logprobs without logprobs": (lambda: request(text=COMPLETION_PROMPT, top_logprobs=2),
                                      "top_logprobs"),
    "best_of below n": (lambda: request(text=COMPLETION_PROMPT, n=3, best_of=2, do_sample=True),
                        "best_of"),
    "empty stop string": (lambda: request(text=COMPLETION_PROMPT, stop=[""]), "stop"),
    "priority out of range": (lambda: request(text=COMPLETION_PROMPT, priority=9), "priority"),
}


@pytest.mark.parametrize("case", INVALID_REQUESTS)
def test_invalid_request_is_invalid_argument_naming_the_field(grpc_server, generation,
                                                             case) -> None:
    build, field = INVALID_REQUESTS[case]
    error = rpc_error(generation, build())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(f"{field}: "), error.details()
    # The field travels apart from the text too, as gRPC's rich error model carries it.
    assert field_violations(error) == [(field, error.details().removeprefix(f"{field}: "))]
    assert_still_serves(generation)
    # The server's own log line, for clients that call it directly.
    assert logged(grpc_server, f"request ended with INVALID_ARGUMENT: {error.details()}")


def test_unknown_role_message_quotes_the_role(generation) -> None:
    error = rpc_error(generation, request(messages=chat(("wizard", QUESTION))))
    assert "'wizard'" in error.details()
    assert "user" in error.details()


def test_wrong_model_name_is_not_found(generation) -> None:
    error = rpc_error(generation, request(text=COMPLETION_PROMPT, model_name="gpt-5",
                                          max_new_tokens=2))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "gpt-5" in error.details()
    assert_still_serves(generation)


def test_empty_and_served_model_names_both_work(generation) -> None:
    served = generate(generation, request(text=COMPLETION_PROMPT, model_name=MODEL,
                                          do_sample=False, max_new_tokens=3))
    default = generate(generation, request(text=COMPLETION_PROMPT, model_name="",
                                           do_sample=False, max_new_tokens=3))
    assert token_ids(served) == token_ids(default)
    assert len(token_ids(default)) == 3


def test_timeout_is_in_seconds(generation) -> None:
    """1 µs runs out before the first token; 30 s does not."""
    error = rpc_error(generation, request(text=COMPLETION_PROMPT, timeout=1e-6, max_new_tokens=2))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    responses = generate(generation, request(text=COMPLETION_PROMPT, timeout=30.0,
                                             do_sample=False, priority=2, max_new_tokens=2))
    assert responses[-1].finish_reason == "length"
    assert responses[-1].generated_tokens == 2


def test_seed_0_is_a_seed(generation) -> None:
    """TGI's seeds are any u64 (MindIE's routes refuse 0 in their translator)."""
    message = request(text=COMPLETION_PROMPT, seed=0, max_new_tokens=2)
    assert generate(generation, message)[-1].seed == 0


# --- cancellation and stopping -----------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2])
def test_cancelled_call_frees_its_slots(generation, management, n) -> None:
    assert wait_for_all_slots_free(management).free_slots == slot_count(management).total_slots
    call = generation.Generate(request(text=COMPLETION_PROMPT, max_new_tokens=400, ignore_eos=True,
                                       n=n, do_sample=n > 1), timeout=CALL_TIMEOUT_S)
    responses = [next(call) for _ in range(3 * n)]
    assert not any(response.finish_reason for response in responses)
    busy = slot_count(management)
    assert busy.free_slots == busy.total_slots - n
    call.cancel()
    with pytest.raises(grpc.RpcError) as raised:
        list(call)
    assert raised.value.code() == grpc.StatusCode.CANCELLED
    slots = wait_for_all_slots_free(management)
    assert slots.free_slots == slots.total_slots > 0
    assert slots.available_tokens_length >= busy.available_tokens_length
    assert_still_serves(generation)


def stop_infer(management: sb_grpc.ManagementStub, client_id: str) -> sb.StopInferResponse:
    return management.StopInfer(sb.StopInferRequest(model_name=MODEL, id=client_id), timeout=10)


def long_call(generation: sb_grpc.GenerationStub, client_id: str, **parameters: object):
    return generation.Generate(request(text=COMPLETION_PROMPT, id=client_id, max_new_tokens=400,
                                       ignore_eos=True, **parameters), timeout=CALL_TIMEOUT_S)


def test_stop_infer_ends_a_generation_by_its_client_id(generation, management) -> None:
    call = long_call(generation, "gen-stop-1", do_sample=False)
    responses = [next(call)]
    assert stop_infer(management, "gen-stop-1").num_stopped == 1
    responses.extend(call)
    assert_one_last_response(responses)
    assert responses[-1].finish_reason == "stopped"
    assert responses[-1].generated_tokens == len(token_ids(responses)) < 400
    # Once ended, the id no longer names a running request.
    with pytest.raises(grpc.RpcError) as raised:
        stop_infer(management, "gen-stop-1")
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert wait_for_all_slots_free(management).free_slots == slot_count(management).total_slots


def test_management_calls_without_a_model_name_are_for_the_served_model(generation,
                                                                        management) -> None:
    """As the Generation service's: an empty model_name is the served model."""
    call = long_call(generation, "gen-stop-unnamed", do_sample=False)
    next(call)
    assert management.GetSlotCount(sb.GetSlotCountRequest(), timeout=10).total_slots == \
        slot_count(management).total_slots
    stopped = management.StopInfer(sb.StopInferRequest(id="gen-stop-unnamed"), timeout=10)
    assert stopped.num_stopped == 1
    assert [response.finish_reason for response in call][-1] == "stopped"


def test_stop_infer_stops_every_sequence_and_every_request_sharing_the_id(
        generation, management) -> None:
    multi = long_call(generation, "gen-stop-2", n=2, do_sample=True)
    single = long_call(generation, "gen-stop-2", do_sample=False)
    started = [next(multi), next(single)]
    assert stop_infer(management, "gen-stop-2").num_stopped == 2
    responses = [*started[:1], *multi]
    for index in (0, 1):
        sequence = of_index(responses, index)
        assert_one_last_response(sequence)
        assert sequence[-1].finish_reason == "stopped"
    assert [*started[1:], *single][-1].finish_reason == "stopped"
    assert wait_for_all_slots_free(management).free_slots == slot_count(management).total_slots


# --- KServe repository index and reflection ----------------------------------------------------

def test_the_published_parameter_limits_are_what_generate_checks(generation, inference) -> None:
    """GetParameterLimits (which the gateway's OpenAPI documents state): the engine's ranges,
    n within this server's maxBestOf, the stop strings' most; past a bound, Generate refuses
    the field."""
    limits = generation.GetParameterLimits(sb.GetParameterLimitsRequest(), timeout=10).parameters
    top_p = limits["top_p"]
    assert (top_p.minimum, top_p.exclusive_minimum, top_p.maximum, top_p.exclusive_maximum) == (
        0, True, 1, False)
    assert not limits["temperature"].HasField("maximum")
    # The gateway bounds its calls' deadlines by it.
    assert limits["timeout"].maximum == 3600
    config = inference.ModelConfig(pb.ModelConfigRequest(name=MODEL), timeout=10).config
    assert limits["n"].maximum == int(config.parameters["max_sequences"].string_value)
    assert limits["stop"].max_items == int(config.parameters["max_stop_sequences"].string_value)
    error = rpc_error(generation, request(text=QUESTION, top_p=top_p.maximum + 0.5))
    assert field_violations(error)[0][0] == "top_p"
    assert generation.GetParameterLimits(sb.GetParameterLimitsRequest(model_name=MODEL),
                                         timeout=10).parameters == limits


def test_repository_index_lists_the_served_model(inference) -> None:
    for ready in (False, True):
        index = inference.RepositoryIndex(pb.RepositoryIndexRequest(ready=ready), timeout=10)
        assert [(model.name, model.version, model.state) for model in index.models] == \
            [(MODEL, "1", "READY")]
    with pytest.raises(grpc.RpcError) as refused:
        inference.RepositoryIndex(pb.RepositoryIndexRequest(repository_name="models"), timeout=10)
    assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert refused.value.details() == "'repository_name' specification is not supported"


def test_model_ready_is_false_for_a_model_or_version_not_served(inference) -> None:
    """As Triton's ModelReady (tritonclient's is_model_ready), not an error."""
    def ready(name: str, version: str = "") -> bool:
        return inference.ModelReady(pb.ModelReadyRequest(name=name, version=version),
                                    timeout=10).ready

    assert ready(MODEL) and ready(MODEL, "1")
    assert not ready("no-such-model") and not ready(MODEL, "2")


def stream_request(request_id: str, prompt: str, **parameters: object) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=MODEL, model_version="1", id=request_id,
                                   parameters={name: to_parameter(name, value)
                                               for name, value in parameters.items()})
    message.inputs.add(name="text_input", datatype="BYTES", shape=[1]) \
        .contents.bytes_contents.append(prompt.encode())
    return message


def test_stream_errors_name_their_request_and_end_it(inference) -> None:
    """As Triton's: an error response carries its request's id, model and version and is its
    final response, whether the request was refused (top_p) or failed while generating
    (timeout)."""
    requests = [stream_request("refused", COMPLETION_PROMPT, top_p=1.5),
                stream_request("timed-out", COMPLETION_PROMPT, timeout=300_000,
                               max_new_tokens=500, ignore_eos=True),
                stream_request("served", COMPLETION_PROMPT, do_sample=False, max_new_tokens=2)]
    requests[0].model_version = ""  # the served version is named all the same
    responses = list(inference.ModelStreamInfer(iter(requests), timeout=CALL_TIMEOUT_S))
    by_id: dict[str, list[pb.ModelStreamInferResponse]] = {}
    for response in responses:
        by_id.setdefault(response.infer_response.id, []).append(response)
    assert by_id.keys() == {"refused", "timed-out", "served"}
    for request_id, reason in (("refused", "top_p"), ("timed-out", "timed out")):
        *tokens, last = by_id[request_id]
        assert reason in last.error_message
        assert (last.infer_response.model_name, last.infer_response.model_version) == (MODEL, "1")
        assert last.infer_response.parameters["triton_final_response"].bool_param
        assert not any(token.error_message for token in tokens)
    assert len(by_id["timed-out"]) > 1  # it was refused while generating, not before
    assert [response.error_message for response in by_id["served"]] == ["", ""]


def test_unsupported_rpcs_answer_unimplemented_naming_the_rpc(grpc_server, inference) -> None:
    for call, message in ((inference.LogSettings, pb.LogSettingsRequest()),
                          (inference.RepositoryModelLoad,
                           pb.RepositoryModelLoadRequest(model_name=MODEL))):
        with pytest.raises(grpc.RpcError) as caught:
            call(message, timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert caught.value.details().startswith(f"{message.DESCRIPTOR.name.removesuffix('Request')}"
                                                 " is not supported")
    assert "NotImplementedError" not in grpc_server.log_text()


def test_reflection_lists_generation_and_management(channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert {"switchboard.v1.Generation", "switchboard.v1.Management",
            "inference.GRPCInferenceService", "grpc.health.v1.Health"} <= services
    # Reflection serves the service's own definition: a client can discover Generate by it.
    file = database.FindFileContainingSymbol("switchboard.v1.Generation")
    [service] = [service for service in file.service if service.name == "Generation"]
    methods = {method.name: (method.input_type, method.output_type, method.server_streaming)
               for method in service.method}
    assert methods == {
        "Generate": (".switchboard.v1.GenerateRequest", ".switchboard.v1.GenerateResponse", True),
        "Tokenize": (".switchboard.v1.TokenizeRequest", ".switchboard.v1.TokenizeResponse", False),
        "Detokenize": (".switchboard.v1.DetokenizeRequest", ".switchboard.v1.DetokenizeResponse",
                       False),
        "GetParameterLimits": (".switchboard.v1.GetParameterLimitsRequest",
                               ".switchboard.v1.GetParameterLimitsResponse", False),
        "InferStream": (".inference.ModelInferRequest", ".inference.ModelStreamInferResponse", True),
    }


def test_tokenize_matches_the_ids_a_text_prompt_is_generated_from(generation) -> None:
    tokenized = generation.Tokenize(sb.TokenizeRequest(text=QUESTION), timeout=10)
    assert "".join(tokenized.texts) == QUESTION
    responses = generate(generation, request(text=QUESTION, max_new_tokens=1,
                                             prompt_logprobs=True))
    assert list(tokenized.ids) == [token.id for token in responses[0].prompt]
    with pytest.raises(grpc.RpcError) as caught:
        generation.Tokenize(sb.TokenizeRequest(model_name="nope", text="x"), timeout=10)
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND


def test_tokenize_tells_where_each_token_comes_from_in_the_text(generation) -> None:
    tokenized = generation.Tokenize(sb.TokenizeRequest(text=QUESTION), timeout=10)
    assert len(tokenized.spans) == len(tokenized.ids) > 1
    assert "".join(QUESTION[span.start:span.stop] for span in tokenized.spans) == QUESTION
    assert tokenized.max_sequence_length > 0


def test_tokens_of_one_character_share_its_span(generation) -> None:
    """Byte-level BPE splits 世 into several tokens: each spans the whole character, in code
    points, as TGI's /tokenize gives them."""
    text = "Hi 世界"
    tokenized = generation.Tokenize(sb.TokenizeRequest(text=text), timeout=10)
    spans = [(span.start, span.stop) for span in tokenized.spans]
    assert [text[start:stop] for start, stop in spans] == \
        ["Hi", " ", "世", "世", "界", "界", "界"]


def test_tokenize_spells_each_token_as_the_vocabulary_does(generation) -> None:
    """vLLM's token_strs: the vocabulary's strings, not decoded text (byte-level BPE writes
    the space before "the" as Ġ)."""
    tokenized = generation.Tokenize(sb.TokenizeRequest(text="Hi the"), timeout=10)
    assert list(tokenized.vocabulary_strings) == ["Hi", "Ġthe"]
    assert list(tokenized.texts) == ["Hi", " the"]


def test_tokenize_chat_messages_gives_the_ids_a_chat_prompt_is_generated_from(generation
                                                                              ) -> None:
    messages = chat(("user", QUESTION))
    tokenized = generation.Tokenize(sb.TokenizeRequest(messages=messages), timeout=10)
    responses = generate(generation, request(messages=messages, max_new_tokens=1,
                                             prompt_logprobs=True))
    assert list(tokenized.ids) == [token.id for token in responses[0].prompt]


def test_tokenize_chat_messages_answers_the_templated_text_and_each_tokens_place_in_it(
        generation) -> None:
    """TGI's /chat_tokenize: the text the chat template wrote, special tokens included, and
    each token's characters in it."""
    tokenized = generation.Tokenize(sb.TokenizeRequest(messages=chat(("user", "Hi 世界"))),
                                    timeout=10)
    text = tokenized.templated_text
    assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nHi 世界<|im_end|>" in text
    spans = [(span.start, span.stop) for span in tokenized.spans]
    assert len(spans) == len(tokenized.ids)
    assert text[slice(*spans[0])] == "<|im_start|>"
    # The tokens of one character (世, 界) share its span; the spans tile the text.
    assert "".join(text[start:stop] for start, stop in dict.fromkeys(spans)) == text
    assert not generation.Tokenize(sb.TokenizeRequest(text="Hi"), timeout=10).templated_text


def test_detokenize_inverts_tokenize_special_tokens_included(generation) -> None:
    messages = chat(("user", QUESTION))
    ids = generation.Tokenize(sb.TokenizeRequest(messages=messages), timeout=10).ids
    text = generation.Detokenize(sb.DetokenizeRequest(token_ids=ids), timeout=10).text
    assert text.startswith("<|im_start|>") and QUESTION in text
    plain = generation.Tokenize(sb.TokenizeRequest(text=text, add_special_tokens=False),
                                timeout=10)
    assert list(plain.ids) == list(ids)


def test_detokenize_refuses_an_id_outside_the_vocabulary_naming_the_field(generation) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        generation.Detokenize(sb.DetokenizeRequest(token_ids=[1, 10**6]), timeout=10)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("token_ids")
