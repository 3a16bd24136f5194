"""N-gram speculation: the guesses, each request's draft window, and the engine core verifying
guesses with the scripted fake runner (the output must be the one decoding token by token
gives)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
import torch
from fakes import FakeRunner, ids, make_core, make_request, run

from switchboard.engine.core import EngineCore
from switchboard.engine.params import GenerationRequest
from switchboard.engine.speculation import MAX_PAUSE_STEPS, DraftWindow, propose_ngram


@pytest.mark.parametrize(("text", "num_tokens", "expected"), [
    ("abcdxyzabc", 3, "dxy"),   # the longest repeated suffix, 'abc', was followed by 'dxy'
    ("xbcqbcybc", 1, "y"),      # the latest occurrence of 'bc' ...
    ("xcqwcc", 2, "qw"),        # ... unless only an earlier one is followed by as many
    ("aaaa", 3, "aaa"),         # a loop: 'a' is followed by 3 tokens, 'aaa' by one
    ("abcdxyzabc", 10, "dxyzabc"),
    ("abcd", 3, ""),            # nothing repeats
    ("a", 3, ""),
    ("abab", 0, ""),
])
def test_guesses_are_what_followed_the_latest_occurrence_of_the_longest_repeated_suffix(
        text: str, num_tokens: int, expected: str) -> None:
    assert propose_ngram(ids(text), num_tokens) == ids(expected)


def test_a_draft_window_shrinks_to_one_past_what_was_accepted_and_pauses_longer_each_miss() -> None:
    window = DraftWindow()
    assert window.next_size(4) == 4
    window.record(2)
    assert window.next_size(4) == 3
    # After the n-th miss in a row, 2**(n-1) paused steps (at most MAX_PAUSE_STEPS), then one guess.
    for pause in (1, 2, 4, 8, 16, MAX_PAUSE_STEPS, MAX_PAUSE_STEPS):
        window.record(0)
        assert [window.next_size(4) for _ in range(pause + 1)] == [0] * pause + [1]
    window.record(1)
    assert window.next_size(4) == 2 and window.paused_steps == 0


def speculative_core(runner: FakeRunner, **options: object) -> EngineCore:
    return make_core(runner, num_speculative_tokens=3, **options)


def token_ids(outputs) -> list[int]:
    return [token for output in outputs for token in output.new_token_ids]


def test_repeating_text_verifies_several_tokens_a_step_and_gives_the_same_events() -> None:
    scripts = {"abcab": "cab"}  # the model loops: c a b c a b ...
    plain_core = make_core(FakeRunner(scripts=scripts))
    core = speculative_core(runner := FakeRunner(scripts=scripts))
    plain_core.add(make_request("r", "abcab", max_new_tokens=12))
    core.add(make_request("r", "abcab", max_new_tokens=12))
    plain, speculated = run(plain_core)["r"], run(core)["r"]
    assert [(o.new_token_ids, o.text, o.finish_reason, o.num_generated_tokens) for o in plain] \
        == [(o.new_token_ids, o.text, o.finish_reason, o.num_generated_tokens) for o in speculated]
    assert ("speculate", "cabc") in runner.calls  # the newest token and three guesses
    stats = core.stats()
    assert stats.num_steps < plain_core.stats().num_steps - 5
    assert stats.num_free_blocks == stats.num_total_blocks
    # Each step gave the request one token, and one more per accepted guess.
    assert stats.num_steps + stats.num_accepted_tokens == 12
    assert 0 < stats.num_accepted_tokens <= stats.num_draft_tokens <= 3 * stats.num_drafts
    # A guessed token is accepted only after those before it in its guess.
    per_position = stats.num_accepted_tokens_per_position
    assert len(per_position) == 3 and sum(per_position) == stats.num_accepted_tokens
    assert per_position[0] > 0 and list(per_position) == sorted(per_position, reverse=True)
    assert plain_core.stats().num_accepted_tokens_per_position == ()


@pytest.mark.parametrize(("prompt", "script", "options"), [
    ("abcab", "cabx", {}),                      # a guess rejected at each loop
    ("abab", "abababc", {}),
    ("abcab", "cab", {"stop": ("bca",)}),        # a stop string ends it amid accepted guesses
    ("abcab", "cab", {"stop_token_ids": frozenset(ids("b"))}),
    ("abcab", "cab", {"max_new_tokens": 7}),
    ("xyzxyz", "xyzxyq", {"include_stop_str_in_output": True, "stop": ("yq",)}),
])
def test_guesses_never_change_a_request_s_output(prompt: str, script: str,
                                                 options: dict[str, object]) -> None:
    outputs = []
    for core in (make_core(FakeRunner(scripts={prompt: script})),
                 speculative_core(FakeRunner(scripts={prompt: script}))):
        request = make_request("r", prompt, max_new_tokens=16)
        core.add(dataclasses.replace(
            request, sampling=dataclasses.replace(request.sampling, **options)))
        events = run(core)["r"]
        outputs.append(([event.text for event in events], token_ids(events),
                        events[-1].finish_reason))
        stats = core.stats()
        assert stats.num_free_blocks == stats.num_total_blocks
    assert outputs[0] == outputs[1]


def test_no_guess_is_made_past_what_a_request_may_still_generate() -> None:
    core = speculative_core(runner := FakeRunner(scripts={"abcab": "cab"}))
    core.add(make_request("r", "abcab", max_new_tokens=2))
    assert token_ids(run(core)["r"]) == list(ids("ca"))
    assert not [call for call in runner.calls if call[0] == "speculate"]


@pytest.mark.parametrize(("num_requests", "speculates"), [(2, True), (3, False)])
def test_guessing_stops_when_more_requests_decode_than_the_speculative_batch_limit(
        num_requests: int, speculates: bool) -> None:
    core = speculative_core(runner := FakeRunner(scripts={"abcab": "cab"}),
                            speculative_max_batch=2)
    for index in range(num_requests):
        core.add(make_request(f"r{index}", "abcab", max_new_tokens=9))
    assert all(token_ids(events) == list(ids("cabcabcab")) for events in run(core).values())
    assert any(call[0] == "speculate" for call in runner.calls) is speculates


def test_guesses_take_only_free_blocks_and_never_preempt() -> None:
    """5 prompt and 11 new tokens fill the 4 blocks of 4; guesses past them get no block."""
    core = speculative_core(runner := FakeRunner(scripts={"abcab": "cab"}), num_blocks=4)
    core.add(make_request("r", "abcab", max_new_tokens=11))
    assert token_ids(run(core)["r"]) == list(ids("cabcabcabca"))
    assert core.stats().num_preemptions == 0
    assert any(call[0] == "speculate" for call in runner.calls)


class FlatRunner(FakeRunner):
    """Flat logits that follow the whole context: every token is a draw, and rows after a
    guess follow it, whatever was drawn."""

    def _next_logits(self, request_id: str, context: list[int]) -> torch.Tensor:
        return self.context_logits(context) * 0.1

    @staticmethod
    def _agrees(row: torch.Tensor, context: Sequence[int], guess: int) -> bool:
        return True


def test_seeded_sampling_draws_the_same_tokens_with_guesses() -> None:
    """Every token is a draw from the request's generator, which verification consumes
    exactly as decoding one token at a time does."""
    results = []
    runners = FlatRunner(), FlatRunner()
    for core in (make_core(runners[0]), speculative_core(runners[1])):
        request: GenerationRequest = make_request("r", "abcabcab", max_new_tokens=24)
        core.add(dataclasses.replace(request, sampling=dataclasses.replace(
            request.sampling, do_sample=True, seed=3)))
        results.append(token_ids(run(core)["r"]))
    assert results[0] == results[1]
    assert any(call[0] == "speculate" for call in runners[1].calls)
