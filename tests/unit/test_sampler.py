"""engine.sampler on hand-made logits: `sample_row` (temperature, top-k, top-p, typical-p, seeds)
and `sample_batch` (greedy rows, penalties, min-token masks, logprobs, per-request seeds)."""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

import pytest
import torch
from fakes import FakeTokenizer

from switchboard.engine.detokenizer import IncrementalDetokenizer
from switchboard.engine.params import GenerationRequest, SamplingParams
from switchboard.engine.request import Request, TokenLogprob
from switchboard.engine.sampler import make_generator, sample_batch, sample_row

# Probabilities 0.5, 0.3, 0.2: the entropy (1.03 nats) is closest to token 1's surprisal (1.20).
SKEWED = torch.tensor([math.log(0.5), math.log(0.3), math.log(0.2)])
EOS = 3


def params(**overrides: object) -> SamplingParams:
    return SamplingParams(**{"do_sample": False, "seed": 1, "max_new_tokens": 100, **overrides})


def request(prompt: Sequence[int] = (0,), output: Sequence[int] = (), **sampling: object
            ) -> Request:
    """A request as EngineCore.add builds it, having generated `output` so far."""
    spec = GenerationRequest(request_id="r", prompt_token_ids=tuple(prompt),
                             sampling=params(**sampling))
    built = Request(spec=spec, arrival_index=0,
                    detokenizer=IncrementalDetokenizer(FakeTokenizer(), spec.prompt_token_ids),
                    generator=make_generator(spec.sampling.seed))
    built.output_token_ids.extend(output)
    return built


def pick(logits: Sequence[float], sampled: Request) -> int:
    [(token, _)] = sample_batch(torch.tensor([logits]), [sampled], {EOS})
    return token


def draws(logits: torch.Tensor, sampling: SamplingParams, count: int, seed: int = 1234
          ) -> list[int]:
    generator = make_generator(seed)
    return [sample_row(logits, sampling, generator) for _ in range(count)]


# sample_row: the sampling path of one row.

def test_top_k_1_returns_the_argmax_even_at_high_temperature() -> None:
    logits = torch.tensor([1.0, 1.1, 0.9, 1.05])
    assert draws(logits, params(do_sample=True, top_k=1, temperature=100.0), 50) == [1] * 50


@pytest.mark.parametrize(("top_p", "kept"), [
    (0.01, {0}),        # the top token alone already reaches top_p
    (0.6, {0, 1}),      # 0.5 < 0.6: the second token is needed
    (0.9, {0, 1, 2}),   # 0.8 < 0.9: all three
])
def test_top_p_keeps_the_smallest_set_that_reaches_it(top_p: float, kept: set[int]) -> None:
    assert set(draws(SKEWED, params(do_sample=True, top_p=top_p), 200)) == kept


@pytest.mark.parametrize(("min_p", "kept"), [
    (1.0, {0}),         # only the most likely token (0.5)
    (0.5, {0, 1}),      # 0.3 ≥ 0.5 × 0.5 > 0.2
    (0.35, {0, 1, 2}),  # 0.2 ≥ 0.35 × 0.5
])
def test_min_p_keeps_the_tokens_at_least_that_fraction_as_likely_as_the_top(
        min_p: float, kept: set[int]) -> None:
    assert set(draws(SKEWED, params(do_sample=True, min_p=min_p), 200)) == kept


def test_typical_p_keeps_the_token_whose_surprisal_is_closest_to_the_entropy() -> None:
    assert draws(SKEWED, params(do_sample=True, typical_p=0.1), 50) == [1] * 50


def test_the_same_seed_gives_the_same_draws_and_another_seed_different_ones() -> None:
    logits = torch.zeros(8)
    sampling = params(do_sample=True)
    first = draws(logits, sampling, 50, seed=42)
    assert draws(logits, sampling, 50, seed=42) == first
    assert draws(logits, sampling, 50, seed=43) != first
    assert len(set(first)) > 1


def test_two_equally_likely_tokens_are_both_drawn() -> None:
    counts = collections.Counter(draws(torch.zeros(2), params(do_sample=True), 200, seed=7))
    assert set(counts) == {0, 1}
    assert 60 <= counts[0] <= 140


def test_low_temperature_sharpens_towards_the_argmax() -> None:
    logits = torch.tensor([1.0, 1.2])
    assert draws(logits, params(do_sample=True, temperature=0.01), 50) == [1] * 50
    assert set(draws(logits, params(do_sample=True, temperature=1.0), 50)) == {0, 1}


def test_sample_row_leaves_the_callers_logits_unchanged() -> None:
    logits = torch.tensor([2.0, 1.5, 0.0, -1.0])
    draws(logits, params(do_sample=True, temperature=0.5, top_k=3, top_p=0.9, typical_p=0.9), 5)
    assert logits.tolist() == [2.0, 1.5, 0.0, -1.0]


# sample_batch: penalties, masks and logprobs, row by row.

def test_an_empty_batch_samples_nothing() -> None:
    assert sample_batch(torch.empty(0, 4), [], {EOS}) == []


def test_greedy_rows_take_the_argmax_of_their_own_row() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.5],
                           [3.0, 2.0, -1.0, 1.5],
                           [0.1, 2.0, -1.0, 2.5]])
    sampled = sample_batch(logits, [request() for _ in range(3)], {EOS})
    assert sampled == [(1, None), (0, None), (3, None)]


def test_greedy_ignores_temperature_when_sampling_is_off() -> None:
    greedy = request(temperature=50.0)
    assert [pick([0.1, 2.0, 1.9], greedy) for _ in range(20)] == [1] * 20


@pytest.mark.parametrize("logits", [
    [2.0, 1.5, 0.0],     # a seen positive logit is divided: 2.0 -> 1.0 < 1.5
    [-1.0, -1.5, -3.0],  # a seen negative logit is multiplied: -1.0 -> -2.0 < -1.5
], ids=["positive", "negative"])
@pytest.mark.parametrize(("prompt", "output"), [((0,), ()), ((2,), (0,)), ((0, 2), (0, 0))],
                         ids=["seen-in-prompt", "seen-in-output", "seen-in-both"])
def test_repetition_penalty_makes_greedy_avoid_a_seen_token(
        logits: list[float], prompt: tuple[int, ...], output: tuple[int, ...]) -> None:
    assert pick(logits, request(prompt, output)) == 0
    assert pick(logits, request(prompt, output, repetition_penalty=2.0)) == 1


@pytest.mark.parametrize(("output", "penalties", "expected"), [
    ((), {"presence_penalty": 2.0, "frequency_penalty": 2.0}, 0),  # nothing generated yet
    ((0,), {"presence_penalty": 0.6}, 1),         # 2.0 - 0.6 < 1.5
    ((0, 0, 0), {"presence_penalty": 0.4}, 0),    # counted once: 2.0 - 0.4 > 1.5
    ((0,), {"frequency_penalty": 0.3}, 0),        # 2.0 - 0.3 > 1.5
    ((0, 0), {"frequency_penalty": 0.3}, 1),      # 2.0 - 2 * 0.3 < 1.5
    ((1,), {"presence_penalty": -1.0}, 1),        # a negative penalty encourages: 1.5 + 1.0
    ((1, 1), {"frequency_penalty": -0.3}, 1),     # 1.5 + 2 * 0.3 > 2.0
], ids=["no-output", "presence", "presence-once", "frequency-once", "frequency-twice",
        "negative-presence", "negative-frequency"])
def test_presence_and_frequency_penalties_change_the_greedy_choice(
        output: tuple[int, ...], penalties: dict[str, float], expected: int) -> None:
    assert pick([2.0, 1.5, 0.0], request((0, 0, 0), output, **penalties)) == expected


def test_presence_and_frequency_penalties_follow_openai_over_generated_tokens_only() -> None:
    logits = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    penalized = request(prompt=(2, 2, 2), output=(0, 0, 0, 1),
                        presence_penalty=0.5, frequency_penalty=0.25)
    sample_batch(logits, [penalized], {EOS})  # penalties are applied to the logits in place
    # logit -= frequency * count + presence * (count > 0); the prompt's token 2 is untouched.
    assert logits[0].tolist() == pytest.approx([1.0 - 0.75 - 0.5, 1.0 - 0.25 - 0.5, 1.0, 1.0])


# Token 0 is the best after EOS (3) and the stop token (1).
MIN_TOKENS_LOGITS = [2.0, 2.5, 0.0, 3.0]


@pytest.mark.parametrize(("num_generated", "ignore_eos", "expected"), [
    (0, False, 0),
    (1, False, 0),
    (2, False, EOS),  # min_new_tokens reached: nothing is masked
    (0, True, EOS),   # EOS is no stop for this request; the stop token still is
    (2, True, EOS),
])
def test_min_new_tokens_masks_eos_and_stop_tokens_until_reached(
        num_generated: int, ignore_eos: bool, expected: int) -> None:
    sampled = request(output=[2] * num_generated, min_new_tokens=2, stop_token_ids=frozenset({1}),
                      ignore_eos=ignore_eos)
    assert pick(MIN_TOKENS_LOGITS, sampled) == expected


def test_min_new_tokens_unmasks_a_stop_token_once_reached() -> None:
    logits = [2.0, 2.5, 0.0, 1.0]
    stops = frozenset({1})
    assert pick(logits, request(output=[2], min_new_tokens=2, stop_token_ids=stops)) == 0
    assert pick(logits, request(output=[2, 2], min_new_tokens=2, stop_token_ids=stops)) == 1


def test_min_new_tokens_masks_eos_for_sampled_rows_too() -> None:
    early = request(do_sample=True, min_new_tokens=1)
    assert EOS not in [pick([0.0, 0.0, 0.0, 5.0], early) for _ in range(50)]


def test_logit_bias_moves_greedy_choice_and_leaves_the_logprobs_the_models() -> None:
    logits = [2.0, 1.5, 0.0]
    assert pick(logits, request(logit_bias=((2, 2.5),))) == 2        # 0.0 + 2.5 > 2.0
    assert pick(logits, request(logit_bias=((0, -100.0),))) == 1     # the argmax banned
    assert pick(logits, request(logit_bias=((2, 1.0), (2, 1.5)))) == 2  # biases add up
    [(token, logprob)] = sample_batch(torch.tensor([logits]), [
        request(logit_bias=((2, 100.0),), logprobs=0)], {EOS})
    assert token == 2
    assert logprob.logprob == pytest.approx(float(torch.log_softmax(torch.tensor(logits), 0)[2]))


def test_allowed_token_ids_are_the_only_ones_chosen() -> None:
    assert pick([2.0, 1.5, 0.0], request(allowed_token_ids=frozenset({1, 2}))) == 1
    allowed = request(do_sample=True, allowed_token_ids=frozenset({0, 2}))
    assert {pick([1.0, 5.0, 1.0], allowed) for _ in range(40)} == {0, 2}


def test_logit_bias_applies_to_sampling_too() -> None:
    banned = request(do_sample=True, logit_bias=((0, -100.0), (1, -100.0)))
    assert {pick([1.0, 1.0, 1.0], banned) for _ in range(20)} == {2}


def test_no_logprobs_unless_asked() -> None:
    assert sample_batch(torch.tensor([[0.0, 1.0]]), [request(logprobs=None)], {EOS}) == \
        [(1, None)]


def test_logprob_is_the_log_softmax_of_the_raw_logits_of_the_chosen_token() -> None:
    logits = torch.tensor([2.0, 1.5, 0.0, -1.0])
    raw = torch.log_softmax(logits, dim=-1)
    # The repetition penalty turns the choice to token 1; its logprob ignores the penalty.
    penalized = request(prompt=(0,), repetition_penalty=4.0, logprobs=0)
    [(token, logprob)] = sample_batch(logits.clone().unsqueeze(0), [penalized], {EOS})
    assert token == 1
    assert logprob == TokenLogprob(token_id=1, logprob=pytest.approx(float(raw[1])), top=())


def test_top_logprobs_are_the_most_likely_alternatives_in_order() -> None:
    logits = torch.tensor([0.5, 3.0, -2.0, 1.0, 2.0])
    raw = torch.log_softmax(logits, dim=-1)
    [(token, logprob)] = sample_batch(logits.clone().unsqueeze(0), [request(logprobs=3)], {EOS})
    assert (token, logprob.token_id) == (1, 1)
    assert [token_id for token_id, _ in logprob.top] == [1, 4, 3]
    assert [value for _, value in logprob.top] == pytest.approx(raw[[1, 4, 3]].tolist())
    assert logprob.logprob == pytest.approx(float(raw[1]))


def test_a_seed_gives_the_same_tokens_alone_or_batched_with_other_requests() -> None:
    torch.manual_seed(0)
    steps = [torch.randn(4, 50) for _ in range(10)]

    def batch() -> list[Request]:
        return [request(do_sample=True, seed=seed, temperature=temperature)
                for seed, temperature in ((11, 1.0), (22, 0.7), (33, 1.3))] + [request()]

    batched, alone = batch(), batch()
    together = [[token for token, _ in sample_batch(logits.clone(), batched, {EOS})]
                for logits in steps]
    for row, single in enumerate(alone):
        tokens = [pick(logits[row].tolist(), single) for logits in steps]
        assert tokens == [step[row] for step in together]
    assert len({step[0] for step in together}) > 1  # the rows do sample
