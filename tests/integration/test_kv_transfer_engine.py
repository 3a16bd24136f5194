"""Prefill/decode disaggregation between two engines in one process, with the real model: a
prefill engine keeps a finished prefill's KV cache, a decode engine takes it and decodes as
one engine would have, and both give every block back."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import pytest

from switchboard.engine.errors import InvalidRequest, NotFound
from switchboard.engine.kv_transfer import KV_TRANSFER_FIELD, PrefilledKV

from tests.integration.test_engine_real_model import EngineHarness, text_of, token_ids_of

SYSTEM = "You are a geography teacher who answers in one short sentence. "
PROMPTS = ["What is the capital of France?",
           SYSTEM + "What is the capital of Italy?",
           SYSTEM + "What is the capital of Spain? Name it and its river.",
           "Hi"]


@pytest.fixture(scope="module")
def prefill() -> Iterator[EngineHarness]:
    harness = EngineHarness(block_size=4, kv_transfer_lease_s=30.0)
    yield harness
    harness.close()


@pytest.fixture(scope="module")
def decode() -> Iterator[EngineHarness]:
    harness = EngineHarness(block_size=8)
    yield harness
    harness.close()


def prefilled_elsewhere(prefill: EngineHarness, prompt: str, **parameters) -> PrefilledKV:
    """What a prefill instance hands over: the request runs there for one token, keeping its
    KV cache, which is read and then released."""
    request = dataclasses.replace(prefill.request(prompt, max_new_tokens=1, **parameters),
                                  keep_kv=True)
    [events] = prefill.generate(request)
    transfer_id = events[-1].kv_transfer_id
    assert transfer_id
    kv = prefill.run(prefill.engine.read_kv(transfer_id))
    prefill.engine.release_kv(transfer_id)
    return kv


def decoded(decode: EngineHarness, prompt: str, kv: PrefilledKV, **parameters):
    request = decode.request(prompt, **parameters)
    return decode.run(_events(decode, request, kv))


async def _events(harness: EngineHarness, request, kv: PrefilledKV | None):
    return [event async for event in harness.engine.generate(request, prefilled=kv)]


def assert_all_blocks_free(*harnesses: EngineHarness) -> None:
    for harness in harnesses:
        harness.run(asyncio.sleep(0.1))  # the engine thread applies a release between steps
        stats = harness.engine.stats()
        assert stats.num_free_blocks == stats.num_total_blocks


def test_greedy_tokens_through_prefill_and_decode_equal_one_engines(prefill, decode) -> None:
    expected = [token_ids_of(events) for events in prefill.generate(
        *(prefill.request(prompt, max_new_tokens=16, ignore_eos=True) for prompt in PROMPTS))]
    transferred = [prefilled_elsewhere(prefill, prompt) for prompt in PROMPTS]

    requests = [decode.request(prompt, max_new_tokens=16, ignore_eos=True) for prompt in PROMPTS]

    async def together():
        return await asyncio.gather(*(_events(decode, request, kv)
                                      for request, kv in zip(requests, transferred)))

    assert [token_ids_of(events) for events in decode.run(together())] == expected
    assert_all_blocks_free(prefill, decode)


def test_a_seeded_sampled_request_gives_one_engines_text(prefill, decode) -> None:
    parameters = {"do_sample": True, "temperature": 0.9, "seed": 1234, "max_new_tokens": 12}
    [expected] = prefill.generate(prefill.request(PROMPTS[0], **parameters))
    kv = prefilled_elsewhere(prefill, PROMPTS[0], seed=1234)
    assert text_of(decoded(decode, PROMPTS[0], kv, **parameters)) == text_of(expected)


def test_a_shared_prefix_already_cached_by_the_decode_engine_is_reused(prefill, decode) -> None:
    decode.generate(decode.request(PROMPTS[1], max_new_tokens=1))
    kv = prefilled_elsewhere(prefill, PROMPTS[2])
    events = decoded(decode, PROMPTS[2], kv, max_new_tokens=4)
    assert events[-1].num_cached_tokens == len(kv.token_ids)
    assert_all_blocks_free(decode)


def test_kept_blocks_return_when_the_lease_runs_out() -> None:
    harness = EngineHarness(kv_transfer_lease_s=0.3)
    try:
        request = dataclasses.replace(harness.request(PROMPTS[1], max_new_tokens=1), keep_kv=True)
        [events] = harness.generate(request)
        stats = harness.engine.stats()
        assert stats.num_free_blocks < stats.num_total_blocks
        harness.run(asyncio.sleep(0.6))
        assert_all_blocks_free(harness)
        with pytest.raises(NotFound):
            harness.run(harness.engine.read_kv(events[-1].kv_transfer_id))
    finally:
        harness.close()


def test_kv_of_another_prompt_or_another_layout_is_refused_naming_the_field(prefill,
                                                                             decode) -> None:
    kv = prefilled_elsewhere(prefill, PROMPTS[0])
    with pytest.raises(InvalidRequest, match="another prompt") as refused:
        decoded(decode, PROMPTS[3], kv)
    assert refused.value.field == KV_TRANSFER_FIELD
    foreign = dataclasses.replace(kv, layout=dataclasses.replace(kv.layout, dtype="bfloat16"))
    with pytest.raises(InvalidRequest, match="dtype 'bfloat16' \\(here 'float32'\\)"):
        decoded(decode, PROMPTS[0], foreign)
    assert_all_blocks_free(decode)
