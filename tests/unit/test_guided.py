"""Structured output: patterns from schemas and choices, their validation, and the engine core
keeping a request's text to its pattern with the scripted fake runner and letter tokens."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import re

import pytest
from conftest import child_processes
from fakes import EOS_ID, FakeRunner, make_core, make_request, run
from outlines_core import Guide, Index, Vocabulary
from test_async_engine import ENDLESS, collect, eventually, run_with_engine

from switchboard.engine import guided as guided_module
from switchboard.engine.config import EngineLimits
from switchboard.engine.errors import InvalidRequest, Overloaded
from switchboard.engine.guided import GuideBuilder, allowed_tokens, choice_pattern, json_schema_pattern
from switchboard.engine.index_compiler import CompileLimits
from switchboard.engine.params import OutputPattern
from switchboard.engine.request import FinishReason
from switchboard.engine.validation import build_request

LIMITS = EngineLimits(vocab_size=100, max_seq_len=64, max_input_len=63, max_iter_times=64,
                      max_token_bytes=8)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "population": {"type": "integer"}},
          "required": ["city", "population"]}


LETTERS = {bytes([ord("a") + i]): [i] for i in range(EOS_ID)}
# Every word of one to three letters: an index over them costs as over a real vocabulary.
WORDS = {"".join(word).encode(): [token_id] for token_id, word in enumerate(itertools.chain(
    *(itertools.product("abcdefghijklmnopqrstuvwxy", repeat=size) for size in (1, 2, 3))))}
MiB = 2**20


def letter_guides(cache_bytes: int = MiB) -> GuideBuilder:
    """Guides over the fake tokenizer's vocabulary: one letter a token, 'z' the EOS."""
    return GuideBuilder(lambda: LETTERS, EOS_ID, cache_bytes=cache_bytes,
                        limits=CompileLimits(memory_bytes=256 * MiB, cpu_seconds=10))


def word_guides(memory_mib: int, cpu_seconds: int) -> GuideBuilder:
    return GuideBuilder(lambda: WORDS, len(WORDS), cache_bytes=64 * MiB,
                        limits=CompileLimits(memory_bytes=memory_mib * MiB,
                                             cpu_seconds=cpu_seconds))


def letter_guide(regex: str) -> Guide:
    """A guide compiled here, for the engine core's own tests."""
    return Guide(Index(regex, Vocabulary(EOS_ID, LETTERS)))


def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The patterns compiled from now on."""
    compiled: list[str] = []
    compile_index = guided_module.compile_index

    async def counting(regex: str, *args: object) -> bytes:
        compiled.append(regex)
        return await compile_index(regex, *args)

    monkeypatch.setattr(guided_module, "compile_index", counting)
    return compiled


def test_a_schema_s_pattern_matches_the_json_it_validates_and_not_other_json() -> None:
    regex = json_schema_pattern("guided_json", SCHEMA).regex
    assert re.fullmatch(regex, json.dumps({"city": "Paris", "population": 2100000}))
    assert not re.fullmatch(regex, json.dumps({"city": "Paris"}))
    assert json_schema_pattern("guided_json", json.dumps(SCHEMA)).regex == regex


def test_a_choice_pattern_matches_each_choice_literally() -> None:
    regex = choice_pattern("guided_choice", ["yes", "a.b"]).regex
    assert re.fullmatch(regex, "a.b") and re.fullmatch(regex, "yes")
    assert not re.fullmatch(regex, "axb")


@pytest.mark.parametrize(("parameters", "field"), [
    ({"guided_json": SCHEMA, "guided_regex": "a+"}, "guided_regex"),
    ({"guided_json": 5}, "guided_json"),
    ({"guided_json": {"type": "no-such-type"}}, "guided_json"),
    ({"guided_regex": ""}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["yes", 1]}, "guided_choice"),
], ids=["two", "json-number", "json-bad-schema", "regex-empty", "choice-empty", "choice-int"])
def test_bad_patterns_are_refused_naming_the_field(parameters, field) -> None:
    with pytest.raises(InvalidRequest) as info:
        build_request("r", [1, 2], parameters, LIMITS)
    assert info.value.field == field


def test_a_pattern_the_vocabulary_cannot_spell_is_refused_naming_its_field() -> None:
    with pytest.raises(InvalidRequest) as info:
        asyncio.run(letter_guides().guide(OutputPattern("guided_regex", "[0-9]+")))
    assert info.value.field == "guided_regex"
    with pytest.raises(InvalidRequest, match="guided_regex"):
        asyncio.run(letter_guides().guide(OutputPattern("guided_regex", "(unclosed")))


def test_the_allowed_tokens_mask_is_the_guides_list_of_ids() -> None:
    guide = letter_guide("(ab|c)x")
    mask = allowed_tokens(guide, 40)  # a model's vocabulary may be wider than its tokenizer's
    assert mask.shape == (40,)
    assert set(mask.nonzero().view(-1).tolist()) == set(guide.get_tokens()) == {0, 2}
    guide.advance(0)
    assert allowed_tokens(guide, 40).nonzero().view(-1).tolist() == [1]


def guided(request_id: str, prompt: str, regex: str, **sampling: object):
    request = make_request(request_id, prompt, max_new_tokens=12)
    return dataclasses.replace(request, sampling=dataclasses.replace(
        request.sampling, pattern=OutputPattern("guided_regex", regex), **sampling))


def add_guided(core, request_id: str, prompt: str, regex: str, **sampling: object) -> None:
    core.add(guided(request_id, prompt, regex, **sampling), letter_guide(regex))


def test_the_text_follows_the_pattern_and_ends_with_eos_once_it_is_complete() -> None:
    core = make_core(FakeRunner(scripts={"p": "cab"}))
    add_guided(core, "free", "p", "c[ab]{2}x")  # the model's own choices, then 'x'
    add_guided(core, "forced", "p", "(dd|ee)")  # the model wants none of these
    outputs = run(core)
    free, forced = ("".join(event.text for event in outputs[name]) for name in ("free", "forced"))
    assert free == "cabx"
    assert forced in ("dd", "ee")
    assert all(outputs[name][-1].finish_reason is FinishReason.EOS for name in outputs)


def test_a_match_that_could_end_goes_on_as_far_as_the_pattern_allows() -> None:
    """After 'a' the match 'a{1,2}' is complete, yet the model's next 'a' is still followed."""
    core = make_core(FakeRunner(scripts={"p": "a"}))
    add_guided(core, "r", "p", "a{1,2}")
    events = run(core)["r"]
    assert "".join(event.text for event in events) == "aa"
    assert events[-1].finish_reason is FinishReason.EOS


def test_a_complete_pattern_ends_the_request_even_before_min_new_tokens() -> None:
    """The pattern allows only EOS, min_new_tokens bans it: the pattern wins."""
    core = make_core(FakeRunner(scripts={"p": "cab"}))
    add_guided(core, "r", "p", "ca", min_new_tokens=5)
    events = run(core)["r"]
    assert "".join(event.text for event in events) == "ca"
    assert events[-1].finish_reason is FinishReason.EOS


def test_guesses_are_verified_against_the_pattern_too() -> None:
    """With speculation, each verified token follows the pattern as one at a time would."""
    texts = []
    for options in ({}, {"num_speculative_tokens": 3}):
        core = make_core(FakeRunner(scripts={"abcab": "cab"}), **options)
        add_guided(core, "r", "abcab", "(cab)(cab)(cad)")
        texts.append("".join(event.text for event in run(core)["r"]))
    assert texts == ["cabcabcad", "cabcabcad"]


def test_the_async_engine_refuses_a_pattern_it_cannot_follow_before_queueing_it() -> None:
    core = make_core(FakeRunner())

    async def scenario(engine) -> None:
        with pytest.raises(InvalidRequest) as info:
            await collect(engine.generate(guided("r", "p", "[0-9]+")))
        assert info.value.field == "guided_regex"
        assert engine.stats().num_waiting == engine.stats().num_running == 0
        [*_, last] = await collect(engine.generate(guided("ok", "p", "ca")))
        assert last.finish_reason is FinishReason.EOS

    run_with_engine(scenario, core, guides=letter_guides())


def test_a_pattern_is_compiled_only_once_the_request_is_admitted(monkeypatch) -> None:
    compiled = compiles(monkeypatch)

    async def scenario(engine) -> None:
        busy = engine.generate(make_request("busy", "p", max_new_tokens=ENDLESS))
        async with contextlib.aclosing(busy):
            await anext(busy)
            with pytest.raises(Overloaded):
                await collect(engine.generate(guided("r", "p", "ca")))
        assert compiled == []

    run_with_engine(scenario, make_core(FakeRunner()), max_unfinished=1, guides=letter_guides())


def test_an_index_over_the_memory_bound_is_refused_naming_the_field() -> None:
    """[a-y]{1000} is 11 characters, yet its index over WORDS needs far more than the bound to
    compile."""
    with pytest.raises(InvalidRequest) as info:
        asyncio.run(word_guides(memory_mib=128, cpu_seconds=60).guide(
            OutputPattern("guided_regex", "[a-y]{1000}")))
    assert info.value.field == "guided_regex" and "128 MiB" in info.value.message


def test_an_index_over_the_cpu_time_bound_is_refused_naming_the_field() -> None:
    """a{20000} compiles in little memory, and for several seconds."""
    with pytest.raises(InvalidRequest) as info:
        asyncio.run(word_guides(memory_mib=1024, cpu_seconds=1).guide(
            OutputPattern("structured_outputs", "a{20000}")))
    assert info.value.field == "structured_outputs" and "CPU time" in info.value.message


def compiler_processes() -> list[int]:
    return child_processes(os.getpid(), b"index_compiler")


def test_a_compile_nobody_waits_for_is_abandoned_and_its_process_killed() -> None:
    async def scenario() -> None:
        builder = word_guides(memory_mib=512, cpu_seconds=60)
        slow = OutputPattern("guided_regex", "(abc|bcd|cde|def){4000}")  # seconds of CPU
        waiting = asyncio.create_task(builder.guide(slow))
        await eventually(lambda: bool(compiler_processes()), timeout_s=10)
        waiting.cancel()
        await eventually(lambda: not compiler_processes(), timeout_s=5)
        assert builder.num_cached_bytes == 0
        # A new request for the pattern compiles it anew, rather than wait for the dead one.
        quick = OutputPattern("guided_regex", "abc")
        await builder.guide(quick)

    asyncio.run(scenario())


def test_requests_for_one_pattern_share_its_compile_and_errors_name_their_own_field(
        monkeypatch) -> None:
    compiled = compiles(monkeypatch)

    async def scenario() -> list[BaseException]:
        builder = letter_guides()
        return await asyncio.gather(
            builder.guide(OutputPattern("guided_regex", "[0-9]")),
            builder.guide(OutputPattern("response_format", "[0-9]")),
            return_exceptions=True)

    errors = asyncio.run(scenario())
    assert [error.field for error in errors] == ["guided_regex", "response_format"]
    assert compiled == ["[0-9]"]


def test_the_cache_keeps_the_latest_indexes_within_its_bytes(monkeypatch) -> None:
    compiled = compiles(monkeypatch)
    patterns = [OutputPattern("guided_regex", f"[a-y]{{{size}}}") for size in (200, 300, 400)]

    async def scenario(builder: GuideBuilder) -> None:
        for pattern in patterns:
            await builder.guide(pattern)
        await builder.guide(patterns[-1])

    measuring = letter_guides(cache_bytes=2**40)
    asyncio.run(scenario(measuring))
    total = measuring.num_cached_bytes
    compiled.clear()
    bounded = letter_guides(cache_bytes=total * 2 // 3)
    asyncio.run(scenario(bounded))
    assert 0 < bounded.num_cached_bytes <= total * 2 // 3
    assert compiled == [pattern.regex for pattern in patterns]  # the last one: from the cache
    too_small = letter_guides(cache_bytes=1)
    asyncio.run(scenario(too_small))  # each used, none kept
    assert too_small.num_cached_bytes == 0
