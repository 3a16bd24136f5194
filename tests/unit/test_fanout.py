"""n and best_of through AsyncEngine: several sequences per request, told apart by index."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import defaultdict
from collections.abc import AsyncIterator

import pytest
import torch
from fakes import EOS_ID, VOCAB_SIZE, FakeRunner, make_core
from test_async_engine import LIMITS, collect, eventually, run_with_engine

from switchboard.engine.async_engine import AsyncEngine
from switchboard.engine.errors import InvalidRequest, RequestTimedOut
from switchboard.engine.fanout import generate_many
from switchboard.engine.params import GenerationRequest
from switchboard.engine.request import FinishReason, RequestOutput, TokenLogprob
from switchboard.engine.validation import build_request

PROMPT = [0, 1, 2]


class SkewedRunner(FakeRunner):
    """Every position has the same skewed next-token distribution, EOS excluded: seeds give
    different sequences with different log-probabilities."""

    def execute(self, chunks):
        super().execute(chunks)
        logits = torch.linspace(0.0, 3.0, VOCAB_SIZE)
        logits[EOS_ID] = -torch.inf
        return logits.expand(sum(chunk.samples for chunk in chunks), VOCAB_SIZE).clone()


def request(request_id: str, **parameters: object):
    defaults = {"do_sample": True, "max_new_tokens": 6, "seed": 11}
    return build_request(request_id, PROMPT, {**defaults, **parameters}, LIMITS)


def by_index(outputs: list[RequestOutput]) -> dict[int, list[RequestOutput]]:
    sequences: dict[int, list[RequestOutput]] = defaultdict(list)
    for output in outputs:
        sequences[output.index].append(output)
    return sequences


def text(events: list[RequestOutput]) -> str:
    return "".join(event.text for event in events)


def test_n_sequences_stream_with_their_index_and_the_first_is_the_plain_request() -> None:
    async def scenario(engine: AsyncEngine) -> None:
        outputs = await collect(engine.generate(request("many", n=3)))
        sequences = by_index(outputs)
        assert sorted(sequences) == [0, 1, 2]
        assert all(output.request_id == "many" for output in outputs)
        for events in sequences.values():
            assert len(events) == 6 and events[-1].finish_reason is not None
            assert all(event.finish_reason is None for event in events[:-1])
        assert len({text(events) for events in sequences.values()}) == 3
        [plain] = by_index(await collect(engine.generate(request("one")))).values()
        assert text(plain) == text(sequences[0])

    run_with_engine(scenario, make_core(SkewedRunner()))


def test_best_of_returns_the_n_most_likely_of_its_sequences_ranked() -> None:
    async def scenario(engine: AsyncEngine) -> None:
        outputs = await collect(engine.generate(request("best", n=2, best_of=4)))
        sequences = by_index(outputs)
        assert sorted(sequences) == [0, 1]
        assert all(event.logprobs == () for event in outputs)
        scored = {}
        for index in range(4):
            alone = request(f"seed{index}", seed=11 + index, logprobs=True)
            events = await collect(engine.generate(alone))
            scored[text(events)] = sum(event.logprobs[0].logprob for event in events)
        ranked = sorted(scored, key=scored.get, reverse=True)
        assert [text(sequences[0]), text(sequences[1])] == ranked[:2]

    run_with_engine(scenario, make_core(SkewedRunner()))


@pytest.mark.parametrize(("seed", "seeds"), [(0, [0, 1, 2]), (2**64 - 1, [2**64 - 1, 0, 1])])
def test_sequence_seeds_count_on_from_the_requests_within_the_uint64_range(seed: int,
                                                                          seeds: list[int]) -> None:
    """Seed 0 is a seed (TGI's u64): sequence 0 keeps it, and is the plain request."""
    async def scenario(engine: AsyncEngine) -> None:
        sequences = by_index(await collect(engine.generate(request("many", n=3, seed=seed))))
        assert [sequences[index][-1].seed for index in range(3)] == seeds
        [plain] = by_index(await collect(engine.generate(request("one", seed=seed)))).values()
        assert plain[-1].seed == seed and text(plain) == text(sequences[0])

    run_with_engine(scenario, make_core(SkewedRunner()))


def test_leaving_an_n_request_early_aborts_all_its_sequences() -> None:
    async def scenario(engine: AsyncEngine) -> None:
        stream = engine.generate(request("many", n=3, max_new_tokens=1000))
        async with contextlib.aclosing(stream):
            await anext(stream)
        await eventually(lambda: not engine._core.has_work())

    run_with_engine(scenario, make_core(SkewedRunner()))


PROMPT_LOGPROBS = (None, -1.5, -2.5)


def scripted_children(last: int, logprobs: dict[int, float]):
    """A generate_one whose children each produce one token with the given log-probability
    (child 0 with the prompt's log-probabilities, as the engine's only child asked for
    them); child 0 starts only once child `last` has ended."""
    others_ended = asyncio.Event()

    async def generate_one(child: GenerationRequest, admitted: bool
                           ) -> AsyncIterator[RequestOutput]:
        index = int(child.request_id.rpartition("/")[2])
        if index == 0:
            await others_ended.wait()
        yield RequestOutput(child.request_id, (index,), str(index), 3, 1, child.sampling.seed,
                            finish_reason=FinishReason.LENGTH,
                            logprobs=(TokenLogprob(index, logprobs[index]),),
                            prompt_logprobs=PROMPT_LOGPROBS if index == 0 else ())
        if index == last:
            others_ended.set()

    return generate_one


async def collect_many(generate_one, **parameters: object) -> list[RequestOutput]:
    return [event async for event in generate_many(
        generate_one, request("many", prompt_logprobs=True, **parameters), max_running=3)]


def test_the_prompts_logprobs_come_first_though_another_sequence_starts_first() -> None:
    events = asyncio.run(collect_many(scripted_children(2, {0: -1.0, 1: -1.0, 2: -1.0}), n=3))
    assert events[0].index == 0 and events[0].prompt_logprobs == PROMPT_LOGPROBS
    assert sorted(event.index for event in events) == [0, 1, 2]
    assert all(event.prompt_logprobs == () for event in events[1:])


def test_the_prompts_logprobs_come_first_though_the_sequence_with_them_is_not_ranked() -> None:
    events = asyncio.run(collect_many(scripted_children(2, {0: -9.0, 1: -1.0, 2: -2.0}), n=2,
                                      best_of=3))
    assert [(event.index, event.text) for event in events] == [(0, "1"), (1, "2")]
    assert events[0].prompt_logprobs == PROMPT_LOGPROBS and events[1].prompt_logprobs == ()


@pytest.mark.parametrize(("parameters", "message"), [
    ({"n": 3, "best_of": 2}, "at least n"),
    ({"n": 1, "best_of": 2, "do_sample": False}, "needs sampling"),
    ({"n": 2, "do_sample": False}, "need sampling"),
    ({"n": 0}, "[1, 128]"),
    ({"best_of": 129}, "[1, 128]"),
])
def test_inconsistent_n_and_best_of_are_rejected(parameters: dict, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        request("bad", **parameters)
    assert caught.value.field in parameters and message in caught.value.message


@pytest.mark.parametrize("name", ["n", "best_of"])
def test_more_sequences_than_the_configured_max_best_of_are_refused_naming_the_field(name) -> None:
    limits = dataclasses.replace(LIMITS, max_best_of=4)
    build_request("ok", PROMPT, {"do_sample": True, name: 4}, limits)
    with pytest.raises(InvalidRequest) as caught:
        build_request("bad", PROMPT, {"do_sample": True, name: 5}, limits)
    assert caught.value.field == name and "at most 4" in caught.value.message


def counting_children(done: asyncio.Event | None = None):
    """A generate_one whose children each give one token, once `done` is set (at once without
    it); the most children that ran at once, and those started as admitted."""
    running: list[int] = []
    most = [0]
    admitted_children: list[int] = []

    async def generate_one(child: GenerationRequest, admitted: bool
                           ) -> AsyncIterator[RequestOutput]:
        admitted_children.extend([int(child.request_id.rpartition("/")[2])] if admitted else [])
        running.append(1)
        most[0] = max(most[0], len(running))
        try:
            await asyncio.sleep(0)
            if done is not None:
                await done.wait()
            yield RequestOutput(child.request_id, (1,), "a", 3, 1, child.sampling.seed,
                                finish_reason=FinishReason.LENGTH)
        finally:
            running.pop()

    return generate_one, most, admitted_children


@pytest.mark.parametrize("best_of", [None, 9])
def test_one_requests_sequences_run_at_most_max_running_at_once_and_all_come_back(
        best_of) -> None:
    generate_one, most, admitted = counting_children()
    many = request("many", n=7, best_of=best_of)
    events = asyncio.run(collect(generate_many(generate_one, many, max_running=2)))
    assert sorted(event.index for event in events) == list(range(7))
    assert most[0] == 2
    assert sorted(admitted) == list(range(2, best_of or 7))  # those past the first two


def test_sequences_that_start_later_keep_the_requests_timeout_and_time_out_with_it() -> None:
    async def timeouts_seen(timeout_s: float, first_ends_after_s: float) -> list[float]:
        done = asyncio.Event()
        asyncio.get_running_loop().call_later(first_ends_after_s, done.set)
        seen: list[float] = []
        generate_one, *_ = counting_children(done)

        async def recording(child: GenerationRequest, admitted: bool
                            ) -> AsyncIterator[RequestOutput]:
            seen.append(child.timeout_s)
            async for event in generate_one(child, admitted):
                yield event

        many = dataclasses.replace(request("many", n=2), timeout_s=timeout_s)
        await collect(generate_many(recording, many, max_running=1))
        return seen

    first, second = asyncio.run(timeouts_seen(5.0, 0.2))
    assert first > 4.9 and second < 4.8
    with pytest.raises(RequestTimedOut):
        asyncio.run(timeouts_seen(0.1, 0.2))


def test_later_sequences_of_an_admitted_request_are_not_refused_as_overloaded() -> None:
    """One request in flight at most, one sequence running at a time: all three come."""
    async def scenario(engine: AsyncEngine) -> None:
        outputs = await collect(engine.generate(request("many", n=3)))
        assert sorted(by_index(outputs)) == [0, 1, 2]

    run_with_engine(scenario, make_core(SkewedRunner()), max_unfinished=1, slots_per_request=1)
