"""engine.core.EngineCore driven by a scripted fake runner and a letter tokenizer."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from fakes import EOS_ID, FakeRunner, ids, make_core, make_request, run

from switchboard.engine.core import EngineStats
from switchboard.engine.errors import GenerationFailed, RequestTimedOut
from switchboard.engine.params import GenerationRequest
from switchboard.engine.request import FinishReason, RequestOutput


def texts(outputs: list[RequestOutput]) -> list[str]:
    return [output.text for output in outputs]


def test_request_runs_to_max_new_tokens_and_finishes_with_length() -> None:
    runner = FakeRunner(scripts={"p": "hello"})
    core = make_core(runner)
    core.add(make_request("r", "p", max_new_tokens=4))
    outputs = run(core)["r"]
    assert texts(outputs) == ["h", "e", "l", "l"]
    assert [output.new_token_ids for output in outputs] == [ids("h"), ids("e"), ids("l"), ids("l")]
    assert [output.num_generated_tokens for output in outputs] == [1, 2, 3, 4]
    assert [output.finish_reason for output in outputs] == [None, None, None, FinishReason.LENGTH]
    assert all(output.num_prompt_tokens == 1 and output.seed == 7 for output in outputs)
    assert runner.calls == [("prefill", "p"), ("decode", ids("h")[0]), ("decode", ids("e")[0]),
                            ("decode", ids("l")[0])]
    assert not core.has_work()


def test_eos_token_ends_the_request_with_an_empty_text_event() -> None:
    core = make_core(FakeRunner(scripts={"p": "hiz"}))
    core.add(make_request("r", "p", max_new_tokens=10))
    outputs = run(core)["r"]
    assert texts(outputs) == ["h", "i", ""]
    assert outputs[-1].new_token_ids == (EOS_ID,)
    assert outputs[-1].finish_reason is FinishReason.EOS
    assert outputs[-1].num_generated_tokens == 3


@pytest.mark.parametrize(("script", "stop", "expected_text", "events"), [
    ("abcdef", ("cd",), "ab", 4),
    ("abcdef", ("c",), "ab", 3),
    ("abcdef", ("xy", "bcd", "de"), "a", 4),   # the first complete stop string wins
    ("abcabd", ("abd",), "abc", 6),            # "ab" starts a stop string twice
])
def test_stop_string_ends_the_request_and_is_not_emitted(script: str, stop: tuple[str, ...],
                                                         expected_text: str, events: int) -> None:
    core = make_core(FakeRunner(scripts={"p": script}))
    core.add(make_request("r", "p", max_new_tokens=20, stop=stop))
    outputs = run(core)["r"]
    assert "".join(texts(outputs)) == expected_text
    assert len(outputs) == events
    assert outputs[-1].finish_reason is FinishReason.STOP
    # Each event's decoded text is its token's, neither held back nor cut (TGI's token texts).
    assert [output.decoded_text for output in outputs] == list(script[:events])
    assert [output.finish_reason for output in outputs[:-1]] == [None] * (events - 1)


@pytest.mark.parametrize(("stop", "expected_text"), [
    (("cd",), "abcd"),
    (("xy", "bcd", "de"), "abcd"),  # the first complete stop string, kept whole
])
def test_include_stop_str_in_output_keeps_the_stop_string(stop: tuple[str, ...],
                                                          expected_text: str) -> None:
    core = make_core(FakeRunner(scripts={"p": "abcdef"}))
    core.add(make_request("r", "p", max_new_tokens=20, stop=stop,
                          include_stop_str_in_output=True))
    outputs = run(core)["r"]
    assert "".join(texts(outputs)) == expected_text
    assert outputs[-1].finish_reason is FinishReason.STOP


@pytest.mark.parametrize(("stop", "include", "seen"), [
    # "c", then "cd", may become "cde"; nothing else may.
    (("cde",), False, ["a", "ab", "ab", "ab", "abcdx", "abcdxy", "abcdxyw"]),
    # A long stop string holds back only what begins it (it used to freeze the stream).
    (("zzzzzzzzzzzzzzzzzzzzzzzzzzzzzz", "cde"), False,
     ["a", "ab", "ab", "ab", "abcdx", "abcdxy", "abcdxyw"]),
    (("dxz",), False, ["a", "ab", "abc", "abc", "abc", "abcdxy", "abcdxyw"]),
    # The stop string would be part of the text: nothing to hold back.
    (("cde",), True, ["a", "ab", "abc", "abcd", "abcdx", "abcdxy", "abcdxyw"]),
])
def test_text_that_may_grow_into_a_stop_string_is_held_back_until_it_cannot(
        stop: tuple[str, ...], include: bool, seen: list[str]) -> None:
    core = make_core(FakeRunner(scripts={"p": "abcdxyw"}))
    core.add(make_request("r", "p", max_new_tokens=7, stop=stop,
                          include_stop_str_in_output=include))
    outputs = run(core)["r"]
    emitted = [""]
    for text in texts(outputs):
        emitted.append(emitted[-1] + text)
    assert emitted[1:] == seen  # what the client has seen after each event
    assert outputs[-1].finish_reason is FinishReason.LENGTH


def test_waiting_requests_are_admitted_by_priority_then_arrival() -> None:
    runner = FakeRunner()
    core = make_core(runner, max_running=1)
    for prompt, priority in (("e", 5), ("a", 1), ("c", 3), ("b", 1)):
        core.add(make_request(prompt, prompt, max_new_tokens=1, priority=priority))
    core.step()
    assert (core.num_running, core.num_waiting) == (0, 3)  # one token: done in its first step
    run(core)
    assert runner.prefilled_prompts() == ["a", "b", "c", "e"]


def test_running_requests_are_limited_to_max_running() -> None:
    core = make_core(max_running=2)
    for name in "abc":
        core.add(make_request(name, name, max_new_tokens=5))
    core.step()
    assert (core.num_running, core.num_waiting) == (2, 1)


def test_aborted_waiting_request_emits_nothing_and_never_runs() -> None:
    runner = FakeRunner()
    core = make_core(runner, max_running=1)
    core.add(make_request("running", "a", max_new_tokens=3))
    core.add(make_request("waiting", "b", max_new_tokens=3))
    core.step()
    core.abort("waiting")
    assert (core.num_running, core.num_waiting) == (1, 0)
    outputs = run(core)
    assert set(outputs) == {"running"}
    assert outputs["running"][-1].finish_reason is FinishReason.LENGTH
    assert runner.prefilled_prompts() == ["a"]


def test_aborting_every_request_leaves_the_core_idle() -> None:
    runner = FakeRunner()
    core = make_core(runner, max_running=1)
    core.add(make_request("running", "a", max_new_tokens=10))
    core.add(make_request("waiting", "b", max_new_tokens=10))
    assert [output.request_id for output in core.step()] == ["running"]
    core.abort("running")
    assert core.has_work()
    core.abort("waiting")
    core.abort("no-such-request")
    assert (core.num_running, core.num_waiting, core.has_work()) == (0, 0, False)
    calls = list(runner.calls)
    assert core.step() == []
    assert runner.calls == calls


def test_waiting_request_past_its_timeout_gets_a_timeout_error_and_leaves() -> None:
    runner = FakeRunner()
    core = make_core(runner)
    core.add(make_request("r", "p", timeout_s=0.001))
    time.sleep(0.01)
    [output] = core.step()
    assert isinstance(output.error, RequestTimedOut)
    assert output.error.message == "request timed out after 0.001 s"
    assert (output.request_id, output.new_token_ids, output.text) == ("r", (), "")
    assert output.is_last
    assert not core.has_work()
    assert runner.calls == []


def test_running_request_past_its_timeout_stops_while_others_go_on() -> None:
    core = make_core()
    core.add(make_request("slow", "a", max_new_tokens=10, timeout_s=0.2))
    core.add(make_request("other", "b", max_new_tokens=3))
    core.step()
    time.sleep(0.25)
    outputs = run(core)
    [timed_out] = outputs["slow"]
    assert isinstance(timed_out.error, RequestTimedOut)
    assert timed_out.num_generated_tokens == 1
    assert outputs["other"][-1].finish_reason is FinishReason.LENGTH
    assert outputs["other"][-1].num_generated_tokens == 3


def test_a_model_failure_fails_only_its_request() -> None:
    core = make_core(FakeRunner(scripts={"g": "xyz"}, fail_prefill={"f"}))
    core.add(make_request("bad", "f"))
    core.add(make_request("good", "g", max_new_tokens=2))
    outputs = run(core)
    [failed] = outputs["bad"]
    assert isinstance(failed.error, GenerationFailed)
    assert failed.error.message == "generation failed in the model step"
    assert failed.finish_reason is None and failed.is_last
    assert texts(outputs["good"]) == ["x", "y"]
    assert outputs["good"][-1].finish_reason is FinishReason.LENGTH


def with_sampling(request: GenerationRequest, **changes: object) -> GenerationRequest:
    return dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, **changes))


@pytest.mark.parametrize(("stop_token_ids", "expected_texts"), [
    (ids("c"), ["a", "b", ""]),
    (ids("dc"), ["a", "b", ""]),   # the first of several
    (ids("a"), [""]),
])
def test_a_stop_token_ends_the_request_with_stop(stop_token_ids: tuple[int, ...],
                                                 expected_texts: list[str]) -> None:
    core = make_core(FakeRunner(scripts={"p": "abcdef"}))
    core.add(with_sampling(make_request("r", "p"), stop_token_ids=frozenset(stop_token_ids)))
    outputs = run(core)["r"]
    assert texts(outputs) == expected_texts
    assert outputs[-1].finish_reason is FinishReason.STOP
    assert outputs[-1].new_token_ids == ids("abcdef"[len(expected_texts) - 1])
    assert outputs[-1].num_generated_tokens == len(expected_texts)


@pytest.mark.parametrize(("ignore_eos", "expected_tokens", "expected_text", "finish"), [
    (False, "az", "a", FinishReason.EOS),
    (True, "azbaz", "aba", FinishReason.LENGTH),  # EOS decodes to no text
])
def test_ignore_eos_generates_past_eos_up_to_max_new_tokens(
        ignore_eos: bool, expected_tokens: str, expected_text: str, finish: FinishReason) -> None:
    core = make_core(FakeRunner(scripts={"p": "azb"}))
    core.add(with_sampling(make_request("r", "p", max_new_tokens=5), ignore_eos=ignore_eos))
    outputs = run(core)["r"]
    assert [token for output in outputs for token in output.new_token_ids] == \
        list(ids(expected_tokens))
    assert "".join(texts(outputs)) == expected_text
    assert outputs[-1].finish_reason is finish


@pytest.mark.parametrize(("min_new_tokens", "expected_text", "events"), [
    (0, "a", 2),
    (1, "a", 2),
    (2, "abca", 5),      # the "b" that completes at token 2 is not searched again
    (5, "abcabca", 8),
])
def test_min_new_tokens_delays_a_stop_string(min_new_tokens: int, expected_text: str,
                                             events: int) -> None:
    core = make_core(FakeRunner(scripts={"p": "abc"}))
    core.add(with_sampling(make_request("r", "p", max_new_tokens=10, stop=("b",)),
                           min_new_tokens=min_new_tokens))
    outputs = run(core)["r"]
    assert "".join(texts(outputs)) == expected_text
    assert len(outputs) == events
    assert outputs[-1].finish_reason is FinishReason.STOP


def test_every_token_event_carries_consistent_timings() -> None:
    core = make_core(max_running=2)
    core.add(make_request("long", "a", max_new_tokens=4))
    core.add(make_request("short", "b", max_new_tokens=2))
    core.add(make_request("late", "c", max_new_tokens=2))  # waits for a free slot
    outputs = run(core)
    for events in outputs.values():
        timings = [output.timings for output in events]
        assert all(timing is not None for timing in timings)
        assert len({(timing.queue_wait, timing.first_token) for timing in timings}) == 1
        assert 0 <= timings[0].queue_wait <= timings[0].first_token
        step_times = [timing.step_time for timing in timings]
        assert step_times == sorted(step_times)
    assert [output.timings.batch_size for output in outputs["long"]] == [2, 2, 2, 2]
    assert [output.timings.batch_size for output in outputs["short"]] == [2, 2]
    assert [output.timings.batch_size for output in outputs["late"]] == [2, 2]
    assert outputs["late"][0].timings.queue_wait >= outputs["long"][0].timings.queue_wait
    assert outputs["late"][0].timings.step_time > outputs["short"][-1].timings.step_time


@pytest.mark.parametrize("arrangement", ["failing-first", "failing-second", "other-decoding"])
def test_a_failure_in_a_shared_step_fails_only_its_request(arrangement: str) -> None:
    runner = FakeRunner(scripts={"g": "good"}, fail_prefill={"f"})
    core = make_core(runner, num_blocks=32)
    bad, good = make_request("bad", "f"), make_request("good", "g", max_new_tokens=4)
    first, second = (bad, good) if arrangement == "failing-first" else (good, bad)
    core.add(first)
    early = core.step() if arrangement == "other-decoding" else []
    core.add(second)
    outputs = run(core)
    [failed] = outputs["bad"]
    assert isinstance(failed.error, GenerationFailed) and failed.is_last
    good_outputs = early + outputs["good"]
    assert texts(good_outputs) == ["g", "o", "o", "d"]
    assert [output.num_generated_tokens for output in good_outputs] == [1, 2, 3, 4]
    assert good_outputs[-1].finish_reason is FinishReason.LENGTH
    assert runner.calls.count(("prefill", "f")) == 2  # in the shared batch, then alone
    assert core.scheduler.block_manager.num_free_blocks == 32


def test_free_slots_are_the_batch_places_nobody_claims_and_never_negative() -> None:
    stats = EngineStats(num_free_blocks=25, num_total_blocks=100, num_waiting=1, num_running=2,
                        num_preemptions=0, block_size=16, max_batch_size=8, num_steps=0)
    assert stats.free_slots == 5
    assert dataclasses.replace(stats, num_running=8, num_waiting=20).free_slots == 0


def test_steps_that_run_the_model_are_counted_and_idle_ones_are_not() -> None:
    core = make_core()
    assert core.stats().num_steps == 0
    core.add(make_request("r", "a", max_new_tokens=3))
    run(core)  # the prompt and the first token, then two more tokens
    assert core.stats().num_steps == 3
    core.step()
    assert core.stats().num_steps == 3


def test_token_latency_is_time_since_the_previous_token() -> None:
    core = make_core()
    core.add(make_request("r", "a", max_new_tokens=3))
    timings = [output.timings for output in run(core)["r"]]
    assert timings[0].token_latency == pytest.approx(timings[0].first_token)
    for previous, current in zip(timings, timings[1:]):
        assert current.token_latency == pytest.approx(current.step_time - previous.step_time)


def test_a_stopped_request_ends_with_stopped_and_its_held_back_text_and_frees_its_blocks() -> None:
    core = make_core(FakeRunner(scripts={"p": "abcdxyw"}))
    free_at_start = core.stats().num_free_blocks
    core.add(make_request("r", "p", max_new_tokens=7, stop=("cde",)))
    core.add(make_request("other", "q", max_new_tokens=4))
    seen = [output for _ in range(3) for output in core.step() if output.request_id == "r"]
    assert "".join(texts(seen)) == "ab"  # "c" is held back: it may start "cde"
    core.stop("r")
    outputs = core.step()
    [last] = [output for output in outputs if output.request_id == "r"]
    assert last.finish_reason is FinishReason.STOPPED
    assert (last.new_token_ids, last.text, last.num_generated_tokens) == ((), "c", 3)
    assert [output.request_id for output in outputs if output.request_id != "r"] == ["other"]
    assert run(core)["r"] == []
    assert core.stats().num_free_blocks == free_at_start


def test_stopping_an_unknown_or_finished_request_does_nothing() -> None:
    core = make_core()
    core.add(make_request("r", "a", max_new_tokens=1))
    run(core)
    core.stop("r")
    core.stop("never-seen")
    assert core.step() == []


def expected_prompt_logprobs(prompt: str) -> list[float | None]:
    """What the fake runner's rows give: log_softmax of its logits after each prefix."""
    token_ids = ids(prompt)
    return [None] + [torch.log_softmax(FakeRunner.context_logits(token_ids[:i]), dim=-1)
                     [token_ids[i]].item() for i in range(1, len(token_ids))]


def prompt_logprob_values(output: RequestOutput) -> list[float | None]:
    """The output's prompt log-probabilities, as numbers."""
    return [None if entry is None else entry.logprob for entry in output.prompt_logprobs]


def with_prompt_logprobs(request_id: str, prompt: str, **options: object) -> GenerationRequest:
    return with_sampling(make_request(request_id, prompt, **options), prompt_logprobs=True)


def test_prompt_logprobs_come_on_the_first_token_event_only() -> None:
    core = make_core(FakeRunner(scripts={"hello": "uvw"}))
    core.add(with_prompt_logprobs("r", "hello", max_new_tokens=3))
    outputs = run(core)["r"]
    assert texts(outputs) == ["u", "v", "w"]  # sampling still reads each chunk's last row
    assert prompt_logprob_values(outputs[0]) == pytest.approx(expected_prompt_logprobs("hello"))
    assert [output.prompt_logprobs for output in outputs[1:]] == [(), ()]


def test_prompt_logprobs_carry_the_top_alternatives_asked_for() -> None:
    core = make_core()
    core.add(with_sampling(make_request("r", "hello", max_new_tokens=1), prompt_logprobs=True,
                           logprobs=2))
    first, *rest = run(core)["r"][0].prompt_logprobs
    token_ids = ids("hello")
    assert first is None and [entry.token_id for entry in rest] == list(token_ids[1:])
    for position, entry in enumerate(rest, 1):
        logprobs = torch.log_softmax(FakeRunner.context_logits(token_ids[:position]), dim=-1)
        top = logprobs.topk(2)
        assert [token_id for token_id, _ in entry.top] == top.indices.tolist()
        assert [logprob for _, logprob in entry.top] == pytest.approx(top.values.tolist())


def test_a_one_token_prompt_has_one_null_prompt_logprob() -> None:
    core = make_core()
    core.add(with_prompt_logprobs("r", "p", max_new_tokens=2))
    assert [output.prompt_logprobs for output in run(core)["r"]] == [(None,), ()]


@pytest.mark.parametrize("step_tokens", [1, 3, 4, 64])
def test_prompt_logprobs_are_the_same_whatever_the_prefill_chunks(step_tokens: int) -> None:
    runner = FakeRunner(scripts={"p": "uvw", "abcdefghij": "klm"})
    core = make_core(runner, max_batched_tokens=step_tokens, max_prefill_tokens=step_tokens)
    core.add(make_request("plain", "p", max_new_tokens=8))
    core.add(with_prompt_logprobs("asking", "abcdefghij", max_new_tokens=3))
    outputs = run(core)
    assert prompt_logprob_values(outputs["asking"][0]) == \
        pytest.approx(expected_prompt_logprobs("abcdefghij"))
    assert "".join(texts(outputs["asking"])) == "klm"
    assert "".join(texts(outputs["plain"])) == "uvwuvwuv"
    assert all(output.prompt_logprobs == () for output in outputs["plain"])


def test_a_request_with_prompt_logprobs_reuses_no_cached_prefix_but_shares_its_own() -> None:
    runner = FakeRunner()
    core = make_core(runner)
    prompt = "abcdefghi"  # two full blocks of 4, then one token
    for request_id, asks in (("first", True), ("plain", False), ("again", True)):
        request = make_request(request_id, prompt, max_new_tokens=2)
        core.add(with_sampling(request, prompt_logprobs=asks))
        outputs = run(core)[request_id]
        expected_cached = 0 if asks else 8
        assert outputs[-1].num_cached_tokens == expected_cached
        if asks:
            assert prompt_logprob_values(outputs[0]) == \
                pytest.approx(expected_prompt_logprobs(prompt))
    assert runner.prefilled_prompts() == [prompt, prompt]  # "plain" started at position 8


def test_a_request_preempted_mid_prefill_records_each_prompt_logprob_once() -> None:
    core = make_core(num_blocks=4, max_batched_tokens=2, max_prefill_tokens=2)
    core.add(with_prompt_logprobs("asking", "abcdefghijkl", max_new_tokens=3))
    core.add(make_request("urgent", "p", max_new_tokens=6, priority=1))
    outputs = run(core)
    assert core.stats().num_preemptions > 0
    assert prompt_logprob_values(outputs["asking"][0]) == \
        pytest.approx(expected_prompt_logprobs("abcdefghijkl"))
    assert outputs["asking"][-1].finish_reason is FinishReason.LENGTH


def test_prompt_logprobs_survive_the_one_by_one_retry_of_a_failed_step() -> None:
    core = make_core(FakeRunner(scripts={"good": "ok"}, fail_prefill={"f"}))
    core.add(make_request("bad", "f"))
    core.add(with_prompt_logprobs("good", "good", max_new_tokens=2))
    outputs = run(core)
    assert isinstance(outputs["bad"][0].error, GenerationFailed)
    assert texts(outputs["good"]) == ["o", "k"]
    assert prompt_logprob_values(outputs["good"][0]) == \
        pytest.approx(expected_prompt_logprobs("good"))
