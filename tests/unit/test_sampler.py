"""engine.sampler.sample_next_token on hand-made logits."""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

import pytest
import torch

from engine.params import SamplingParams
from engine.sampler import make_generator, sample_next_token

# Probabilities 0.5, 0.3, 0.2: the entropy (1.03 nats) is closest to token 1's surprisal (1.20).
SKEWED = torch.tensor([math.log(0.5), math.log(0.3), math.log(0.2)])


def params(**overrides: object) -> SamplingParams:
    return SamplingParams(**{"do_sample": False, "seed": 1, "max_new_tokens": 1, **overrides})


def draws(logits: torch.Tensor, sampling: SamplingParams, count: int, seed: int = 1234,
          seen: Sequence[int] = ()) -> list[int]:
    generator = make_generator(seed)
    return [sample_next_token(logits, sampling, seen, generator) for _ in range(count)]


def test_greedy_picks_the_argmax() -> None:
    logits = torch.tensor([0.1, 2.0, -1.0, 1.5])
    assert sample_next_token(logits, params(), [], make_generator(1)) == 1


def test_greedy_ignores_temperature_when_sampling_is_off() -> None:
    logits = torch.tensor([0.1, 2.0, 1.9])
    assert draws(logits, params(temperature=50.0), 20) == [1] * 20


@pytest.mark.parametrize("logits", [
    [2.0, 1.5, 0.0],     # a seen positive logit is divided: 2.0 -> 1.0 < 1.5
    [-1.0, -1.5, -3.0],  # a seen negative logit is multiplied: -1.0 -> -2.0 < -1.5
], ids=["positive", "negative"])
def test_repetition_penalty_makes_greedy_avoid_a_seen_token(logits: list[float]) -> None:
    tensor = torch.tensor(logits)
    assert sample_next_token(tensor, params(), [0], make_generator(1)) == 0
    penalized = params(repetition_penalty=2.0)
    assert sample_next_token(tensor, penalized, [0, 0, 2], make_generator(1)) == 1


def test_repetition_penalty_leaves_the_callers_logits_unchanged() -> None:
    logits = torch.tensor([2.0, 1.5, 0.0])
    sample_next_token(logits, params(repetition_penalty=2.0), [0], make_generator(1))
    assert logits.tolist() == [2.0, 1.5, 0.0]


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
