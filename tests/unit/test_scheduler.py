"""engine.scheduler.Scheduler driven through EngineCore with the fake runner: priorities, the
per-step token budgets, chunked prefill, preemption, prefix caching and block accounting."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import pytest
import torch
from fakes import FakeRunner, letters, make_core, make_request

from switchboard.engine.core import EngineCore
from switchboard.engine.errors import GenerationFailed, RequestTimedOut
from switchboard.engine.paged_runner import SequenceChunk
from switchboard.engine.request import FinishReason, RequestOutput, RequestStatus

DEFAULT_SCRIPT = FakeRunner.DEFAULT_SCRIPT


@dataclass(frozen=True)
class Chunk:
    request_id: str
    start: int
    num_tokens: int


@dataclass
class RecordingRunner(FakeRunner):
    """The fake runner, also recording each step's chunks and checking every sampling chunk's
    context (read back through its block table) against the previous context plus the token
    sampled from it; the base fake only checks the first. A mismatch goes to `broken` rather
    than raising, since the core would turn an exception into GenerationFailed."""

    steps: list[list[Chunk]] = field(default_factory=list)
    broken: list[tuple[str, str, str]] = field(default_factory=list)
    expected: dict[str, list[int]] = field(default_factory=dict)
    previous: dict[str, list[int]] = field(default_factory=dict)

    def execute(self, chunks: Sequence[SequenceChunk]) -> torch.Tensor:
        self.steps.append([Chunk(c.request_id, c.start, len(c.token_ids)) for c in chunks])
        return super().execute(chunks)

    def _next_logits(self, request_id: str, context: list[int]) -> torch.Tensor:
        logits = super()._next_logits(request_id, context)
        expected = self.expected.get(request_id)
        # The same context again is a chunk re-run alone after its batch failed.
        if expected is not None and context not in (expected, self.previous[request_id]):
            self.broken.append((request_id, letters(expected), letters(context)))
        self.previous[request_id] = context
        self.expected[request_id] = [*context, int(logits.argmax())]
        return logits

    def chunks_of(self, request_id: str) -> list[Chunk]:
        return [chunk for step in self.steps for chunk in step if chunk.request_id == request_id]


Outputs = dict[str, list[RequestOutput]]


def step(core: EngineCore, outputs: Outputs) -> list[RequestOutput]:
    """One step; its outputs are also added to each request's in `outputs`."""
    new = core.step()
    for output in new:
        outputs[output.request_id].append(output)
    return new


def steps(core: EngineCore, outputs: Outputs, until: Callable[[], bool],
          max_steps: int = 200) -> Iterator[list[RequestOutput]]:
    """Step until `until()` holds, yielding each step's outputs."""
    for _ in range(max_steps):
        if until():
            return
        yield step(core, outputs)
    raise AssertionError(f"not done after {max_steps} steps")


def run(core: EngineCore, runner: RecordingRunner, outputs: Outputs | None = None) -> Outputs:
    """Step until the core is idle; the outputs of each request, in order."""
    outputs = defaultdict(list) if outputs is None else outputs
    for _ in steps(core, outputs, until=lambda: not core.has_work()):
        pass
    assert runner.broken == []
    return outputs


def text(outputs: list[RequestOutput]) -> str:
    return "".join(output.text for output in outputs)


def scripted(script: str, count: int) -> str:
    """The first `count` letters the fake generates for a script (it cycles)."""
    return (script * (count // len(script) + 1))[:count]


def test_waiting_requests_are_admitted_by_priority_then_arrival() -> None:
    runner = RecordingRunner()
    core = make_core(runner, max_running=1)
    for name, priority in (("e", 5), ("a", 1), ("c", 3), ("b", 1), ("d", 3)):
        core.add(make_request(name, name, max_new_tokens=3, priority=priority))
    outputs = run(core, runner)
    assert [chunk.request_id for chunks in runner.steps for chunk in chunks] == \
        [name for name in "abcde" for _ in range(3)]
    assert all(text(outputs[name]) == "abc" for name in "abcde")


def test_a_long_prompt_is_prefilled_in_chunks_of_max_prefill_tokens() -> None:
    prompt = letters(range(20))
    runner = RecordingRunner(scripts={prompt: "xyw"})
    core = make_core(runner, max_batched_tokens=8, max_prefill_tokens=8)
    core.add(make_request("r", prompt, max_new_tokens=3))
    assert [core.step() for _ in range(2)] == [[], []]  # no token before the prompt is in
    outputs = run(core, runner)["r"]
    assert runner.chunks_of("r") == [Chunk("r", 0, 8), Chunk("r", 8, 8), Chunk("r", 16, 4),
                                     Chunk("r", 20, 1), Chunk("r", 21, 1)]
    assert text(outputs) == "xyw"
    assert outputs[-1].finish_reason is FinishReason.LENGTH


def test_while_nothing_decodes_the_first_prompt_in_line_is_prefilled_whole() -> None:
    first, second = letters(range(20)), letters(range(5, 25))
    runner = RecordingRunner(scripts={first: "xyw", second: "abc"})
    core = make_core(runner, max_batched_tokens=8, max_prefill_tokens=64)
    core.add(make_request("first", first, max_new_tokens=3))
    core.add(make_request("second", second, max_new_tokens=3))
    outputs = run(core, runner)
    # The second prompt waits for the budget left, then shares steps with the first's tokens.
    assert runner.steps[:4] == [[Chunk("first", 0, 20)],
                                [Chunk("first", 20, 1), Chunk("second", 0, 8)],
                                [Chunk("first", 21, 1), Chunk("second", 8, 8)],
                                [Chunk("second", 16, 4)]]
    assert text(outputs["first"]) == "xyw" and text(outputs["second"]) == "abc"


def test_a_prompt_asking_its_logprobs_is_prefilled_in_chunks_even_alone() -> None:
    # Each of its tokens' logits is kept: a long prompt at once would hold them all.
    prompt = letters(range(20))
    runner = RecordingRunner(scripts={prompt: "xyw"})
    core = make_core(runner, max_batched_tokens=8, max_prefill_tokens=64)
    request = make_request("r", prompt, max_new_tokens=1)
    core.add(dataclasses.replace(request, sampling=dataclasses.replace(request.sampling,
                                                                       prompt_logprobs=True)))
    outputs = run(core, runner)["r"]
    assert runner.chunks_of("r") == [Chunk("r", 0, 8), Chunk("r", 8, 8), Chunk("r", 16, 4)]
    assert len(outputs[0].prompt_logprobs) == len(prompt)


@pytest.mark.parametrize("long_priority", [
    5,
    1,
], ids=["same-priority", "higher-priority"])
def test_a_decoding_request_gets_one_token_every_step_while_a_long_prompt_is_prefilled(
        long_priority: int) -> None:
    long_prompt = letters(range(25)) * 2
    runner = RecordingRunner(scripts={"d": "decoding", long_prompt: "long"})
    core = make_core(runner, max_batched_tokens=8, max_prefill_tokens=64)
    outputs: Outputs = defaultdict(list)
    core.add(make_request("decoder", "d", max_new_tokens=30))
    step(core, outputs)
    core.add(make_request("long", long_prompt, max_new_tokens=1, priority=long_priority))
    position = 1  # the decoder's next token to compute
    for new in steps(core, outputs, until=lambda: core.num_running < 2 and not core.num_waiting):
        assert Chunk("decoder", position, 1) in runner.steps[-1]
        assert [output.request_id for output in new].count("decoder") == 1
        assert sum(chunk.num_tokens for chunk in runner.steps[-1]
                   if chunk.request_id == "long") <= 8
        position += 1
    long_chunks = runner.chunks_of("long")
    assert sum(chunk.num_tokens for chunk in long_chunks) == len(long_prompt)
    assert len(long_chunks) == -(-len(long_prompt) // 8)
    run(core, runner, outputs)
    assert text(outputs["long"]) == "l"
    assert text(outputs["decoder"]) == scripted("decoding", 30)


def prompt_tokens_per_step(runner: RecordingRunner, prompt_lengths: dict[str, int]) -> list[int]:
    return [sum(max(0, min(chunk.start + chunk.num_tokens, prompt_lengths[chunk.request_id])
                       - chunk.start) for chunk in step) for step in runner.steps]


@pytest.mark.parametrize("prompt_length", [
    12,
    7,
    1,
])
def test_prompt_tokens_per_step_never_exceed_max_prefill_tokens(prompt_length: int) -> None:
    prompts = {f"r{i}": letters([i] * prompt_length) for i in range(8)}
    runner = RecordingRunner()
    core = make_core(runner, max_batched_tokens=64, max_prefill_tokens=6)
    for request_id, prompt in prompts.items():
        core.add(make_request(request_id, prompt, max_new_tokens=4))
    outputs = run(core, runner)
    per_step = prompt_tokens_per_step(runner, {r: len(p) for r, p in prompts.items()})
    assert max(per_step) <= 6
    assert sum(per_step) == 8 * prompt_length
    assert all(text(outputs[request_id]) == "abcd" for request_id in prompts)


def test_decode_tokens_do_not_count_against_max_prefill_tokens() -> None:
    runner = RecordingRunner()
    core = make_core(runner, max_batched_tokens=64, max_prefill_tokens=6)
    core.add(make_request("first", "abcdef", max_new_tokens=4))
    core.add(make_request("second", "ghijkl", max_new_tokens=4))
    run(core, runner)
    assert runner.steps[:2] == [[Chunk("first", 0, 6)],
                                [Chunk("first", 6, 1), Chunk("second", 0, 6)]]


PREEMPTION_REQUESTS = (("low", "abc", 5), ("high", "def", 1), ("mid", "ghi", 3))
PREEMPTION_SCRIPTS = {"abc": "lowpriority", "def": "highpriority", "ghi": "middle"}


def preemption_core(num_blocks: int) -> tuple[EngineCore, RecordingRunner]:
    runner = RecordingRunner(scripts=PREEMPTION_SCRIPTS)
    core = make_core(runner, num_blocks=num_blocks)
    for request_id, prompt, priority in PREEMPTION_REQUESTS:
        core.add(make_request(request_id, prompt, max_new_tokens=10, priority=priority))
    return core, runner


def test_a_short_pool_preempts_the_lowest_priority_request_and_resumes_it_unchanged() -> None:
    # Each request ends with 12 computed tokens (3 blocks): 9 blocks for a pool of 6.
    core, runner = preemption_core(num_blocks=6)
    outputs: Outputs = defaultdict(list)
    for new in steps(core, outputs, until=lambda: core.scheduler.num_preemptions > 0):
        assert not any(output.error for output in new)
    [victim] = core.scheduler.waiting()
    assert victim.request_id == "low"  # the first to arrive, but the lowest priority
    assert victim.status is RequestStatus.PREEMPTED
    assert (victim.num_computed_tokens, victim.block_table.block_ids) == (0, [])
    assert sorted(r.request_id for r in core.scheduler.running) == ["high", "mid"]
    run(core, runner, outputs)
    assert [chunk.start for chunk in runner.chunks_of("low")].count(0) == 2  # recomputed
    unconstrained = run(*preemption_core(num_blocks=256))
    for request_id, prompt, _ in PREEMPTION_REQUESTS:
        assert text(outputs[request_id]) == scripted(PREEMPTION_SCRIPTS[prompt], 10)
        assert [(o.new_token_ids, o.text, o.finish_reason, o.num_generated_tokens)
                for o in outputs[request_id]] == \
            [(o.new_token_ids, o.text, o.finish_reason, o.num_generated_tokens)
             for o in unconstrained[request_id]]
    assert core.scheduler.block_manager.num_free_blocks == 6


def test_a_request_that_does_not_fit_the_pool_waits_until_blocks_are_freed() -> None:
    # 4 blocks of 4 tokens: the first request grows to all of them (10 + 6 - 1 tokens).
    runner = RecordingRunner(scripts={"abcdefghij": "first", "klmnopqrst": "second"})
    core = make_core(runner, num_blocks=4)
    core.add(make_request("first", "abcdefghij", max_new_tokens=6))
    core.add(make_request("second", "klmnopqrst", max_new_tokens=6))
    outputs: Outputs = defaultdict(list)
    first = outputs["first"]
    for _ in steps(core, outputs, until=lambda: bool(first) and first[-1].is_last):
        [waiting] = core.scheduler.waiting()
        assert (waiting.request_id, waiting.status) == ("second", RequestStatus.WAITING)
        assert waiting.block_table.block_ids == []
    assert "second" not in outputs
    run(core, runner, outputs)
    assert core.scheduler.num_preemptions == 0
    assert text(outputs["first"]) == scripted("first", 6)
    assert text(outputs["second"]) == "second"


def test_running_requests_never_exceed_max_running() -> None:
    runner = RecordingRunner()
    core = make_core(runner, max_running=2)
    for name in "abcde":
        core.add(make_request(name, name, max_new_tokens=4))
    outputs: Outputs = defaultdict(list)
    for _ in steps(core, outputs, until=lambda: not core.has_work()):
        assert core.num_running <= 2
        assert len(runner.steps[-1]) <= 2
    assert max(len(chunks) for chunks in runner.steps) == 2
    assert all(text(outputs[name]) == "abcd" for name in "abcde")


def test_a_running_probe_takes_no_slot_from_the_requests_waiting() -> None:
    runner = RecordingRunner()
    core = make_core(runner, max_running=2)
    core.add(make_request("a", "a", max_new_tokens=6))
    core.add(dataclasses.replace(make_request("probe", "p", max_new_tokens=4), probe=True))
    outputs: Outputs = defaultdict(list)
    step(core, outputs)
    core.add(make_request("b", "b", max_new_tokens=6))
    step(core, outputs)
    assert sorted(chunk.request_id for chunk in runner.steps[-1]) == ["a", "b", "probe"]


def test_a_probe_runs_at_once_past_max_running_and_ahead_of_waiting_requests() -> None:
    """MindIE's /health/timed must not report a busy server broken."""
    runner = RecordingRunner()
    core = make_core(runner, max_running=2)
    for name in "abc":
        core.add(make_request(name, name, max_new_tokens=6))
    outputs: Outputs = defaultdict(list)
    step(core, outputs)
    core.add(dataclasses.replace(make_request("probe", "p", max_new_tokens=1), probe=True))
    step(core, outputs)
    assert [chunk.request_id for chunk in runner.steps[-1]] == ["a", "b", "probe"]
    assert outputs["probe"][-1].finish_reason is FinishReason.LENGTH
    assert [request.request_id for request in core.scheduler.waiting()] == ["c"]
    run(core, runner, outputs)
    assert max(len(chunks) for chunks in runner.steps) == 3
    assert all(text(outputs[name]) == "abcdef" for name in "abc")


PREFIX = letters(range(12))  # three full blocks


@pytest.mark.parametrize("first_finished", [True, False], ids=["after", "during"])
@pytest.mark.parametrize(("second_prompt", "num_cached"), [
    (PREFIX + "m", 12),
    (PREFIX + "xyw", 12),
    (PREFIX, 8),             # the last token is always computed
    (PREFIX[:8] + "zzzz", 8),
])
def test_a_request_sharing_a_prompt_prefix_reuses_its_cached_blocks(
        second_prompt: str, num_cached: int, first_finished: bool) -> None:
    first_prompt = PREFIX + "m"
    runner = RecordingRunner(scripts={second_prompt: "other", first_prompt: "first"})
    core = make_core(runner)
    core.add(make_request("first", first_prompt, max_new_tokens=5))
    if first_finished:
        first = run(core, runner)["first"]
    else:
        first = core.step()  # the first prompt is computed and its blocks committed
    core.add(make_request("second", second_prompt, max_new_tokens=5))
    outputs = run(core, runner)
    first.extend(outputs["first"])
    second = outputs["second"]
    assert runner.chunks_of("second")[0] == Chunk("second", num_cached,
                                                  len(second_prompt) - num_cached)
    assert all(output.num_cached_tokens == num_cached for output in second)
    assert all(output.num_cached_tokens == 0 for output in first)
    assert text(first) == "first"
    assert text(second) == ("first" if second_prompt == first_prompt else "other")
    assert core.scheduler.block_manager.num_free_blocks == core.scheduler.block_manager.num_blocks


def test_a_partly_computed_block_is_not_reused() -> None:
    prompt = letters(range(20))
    runner = RecordingRunner(scripts={prompt: "partly"})
    core = make_core(runner, max_batched_tokens=6, max_prefill_tokens=6)
    core.add(make_request("aborted", prompt, max_new_tokens=3))
    core.step()  # tokens 0-5: one full block and half of the next
    core.abort("aborted")
    core.add(make_request("r", prompt, max_new_tokens=3))
    outputs = run(core, runner)["r"]
    assert runner.chunks_of("r")[0] == Chunk("r", 4, 6)
    assert outputs[-1].num_cached_tokens == 4
    assert text(outputs) == "par"


def test_cached_tokens_never_exceed_the_prompt_after_a_preemption() -> None:
    # The victim's first blocks survive its preemption (the winner needs one block), so it
    # resumes from the cache, generated tokens included.
    runner = RecordingRunner()
    core = make_core(runner, num_blocks=5)
    core.add(make_request("winner", "abc", max_new_tokens=12, priority=1))
    core.add(make_request("victim", "def", max_new_tokens=12, priority=5))
    outputs = run(core, runner)
    assert core.scheduler.num_preemptions == 1
    assert text(outputs["victim"]) == DEFAULT_SCRIPT[:12]
    assert all(output.num_cached_tokens <= output.num_prompt_tokens
               for output in outputs["victim"])


def test_identical_prompts_get_identical_outputs_from_the_cache() -> None:
    prompt = PREFIX + "m"
    runner = RecordingRunner(scripts={prompt: "cached"})
    core = make_core(runner)
    core.add(make_request("first", prompt, max_new_tokens=6))
    first = run(core, runner)["first"]
    core.add(make_request("second", prompt, max_new_tokens=6))
    second = run(core, runner)["second"]
    assert [(o.new_token_ids, o.text, o.finish_reason) for o in second] == \
        [(o.new_token_ids, o.text, o.finish_reason) for o in first]
    assert second[-1].num_cached_tokens == 12


def test_without_prefix_caching_a_shared_prefix_is_computed_again() -> None:
    prompt = PREFIX + "m"
    runner = RecordingRunner(scripts={prompt: "again"})
    core = make_core(runner, enable_prefix_caching=False)
    for request_id in ("first", "second"):
        core.add(make_request(request_id, prompt, max_new_tokens=3))
        outputs = run(core, runner)[request_id]
        assert text(outputs) == "aga"
        assert outputs[-1].num_cached_tokens == 0
        assert runner.chunks_of(request_id)[0] == Chunk(request_id, 0, len(prompt))


# Every way a request can end gives all its blocks back. Each scenario builds a core over a
# pool of NUM_BLOCKS, drives it, checks that it saw the ending it meant, and returns the core.

NUM_BLOCKS = 16
PROMPT = letters(range(9))  # spans three blocks
OTHER_PROMPT = letters(range(10, 19))
SCRIPTS = {PROMPT: "xyzw", OTHER_PROMPT: "other"}


def scenario_core(*, fail_prefill: tuple[str, ...] = (), max_running: int = 8
                  ) -> tuple[EngineCore, RecordingRunner]:
    runner = RecordingRunner(scripts=SCRIPTS, fail_prefill=fail_prefill)
    return make_core(runner, num_blocks=NUM_BLOCKS, max_running=max_running), runner


def holds_blocks(core: EngineCore) -> bool:
    return core.scheduler.block_manager.num_free_blocks < NUM_BLOCKS


def finished_by_length() -> EngineCore:
    core, runner = scenario_core()
    core.add(make_request("r", OTHER_PROMPT, max_new_tokens=8))
    outputs = run(core, runner)["r"]
    assert (text(outputs), outputs[-1].finish_reason) == (scripted("other", 8),
                                                          FinishReason.LENGTH)
    return core


def finished_by_eos() -> EngineCore:
    core, runner = scenario_core()
    core.add(make_request("r", PROMPT, max_new_tokens=8))
    outputs = run(core, runner)["r"]
    assert (text(outputs), outputs[-1].finish_reason) == ("xy", FinishReason.EOS)
    return core


def finished_by_stop_string() -> EngineCore:
    core, runner = scenario_core()
    core.add(make_request("r", OTHER_PROMPT, max_new_tokens=8, stop=("er",)))
    outputs = run(core, runner)["r"]
    assert (text(outputs), outputs[-1].finish_reason) == ("oth", FinishReason.STOP)
    return core


def aborted_while_waiting() -> EngineCore:
    core, runner = scenario_core(max_running=1)
    core.add(make_request("running", OTHER_PROMPT, max_new_tokens=3))
    core.add(make_request("waiting", PROMPT, max_new_tokens=3))
    core.step()
    core.abort("waiting")
    assert set(run(core, runner)) == {"running"}
    return core


def aborted_while_running() -> EngineCore:
    core, _ = scenario_core()
    core.add(make_request("first", OTHER_PROMPT, max_new_tokens=8))
    core.add(make_request("second", PROMPT, max_new_tokens=8))
    core.step()
    core.step()
    assert holds_blocks(core)
    core.abort("first")
    core.abort("second")
    return core


def timed_out_while_waiting() -> EngineCore:
    core, runner = scenario_core()
    core.add(make_request("r", PROMPT, timeout_s=1e-9))
    [output] = core.step()
    assert isinstance(output.error, RequestTimedOut)
    assert runner.steps == []
    return core


def timed_out_while_running() -> EngineCore:
    core, runner = scenario_core()
    core.add(make_request("r", OTHER_PROMPT, max_new_tokens=8, timeout_s=60.0))
    core.step()
    core.step()
    [request] = core.scheduler.running
    assert holds_blocks(core)
    request.arrival_time -= 61.0  # its deadline is now past
    [output] = core.step()
    assert isinstance(output.error, RequestTimedOut)
    assert output.num_generated_tokens == 2
    return core


def failed_in_the_model() -> EngineCore:
    core, runner = scenario_core(fail_prefill=(PROMPT,))
    core.add(make_request("good", OTHER_PROMPT, max_new_tokens=4))
    core.add(make_request("bad", PROMPT, max_new_tokens=4))
    outputs = run(core, runner)
    assert isinstance(outputs["bad"][-1].error, GenerationFailed)
    assert text(outputs["good"]) == "othe"
    return core


def preempted_then_finished() -> EngineCore:
    core, runner = scenario_core()
    for index in range(6):  # six requests of up to 12 tokens in 16 blocks
        core.add(make_request(f"r{index}", letters([index] * 3), max_new_tokens=10))
    outputs = run(core, runner)
    assert core.scheduler.num_preemptions > 0
    assert all(output[-1].finish_reason is FinishReason.LENGTH for output in outputs.values())
    return core


def sharing_a_cached_prefix() -> EngineCore:
    core, runner = scenario_core()
    core.add(make_request("first", PROMPT + "a", max_new_tokens=3))
    core.step()
    core.add(make_request("second", PROMPT + "b", max_new_tokens=3))
    outputs = run(core, runner)
    assert outputs["second"][-1].num_cached_tokens == 8
    return core


@pytest.mark.parametrize("scenario", [
    finished_by_length, finished_by_eos, finished_by_stop_string, aborted_while_waiting,
    aborted_while_running, timed_out_while_waiting, timed_out_while_running,
    failed_in_the_model, preempted_then_finished, sharing_a_cached_prefix,
], ids=lambda scenario: scenario.__name__)
def test_every_way_of_ending_gives_all_blocks_back(scenario: Callable[[], EngineCore]) -> None:
    core = scenario()
    assert core.scheduler.block_manager.num_free_blocks == NUM_BLOCKS
    assert not core.has_work()
    assert (core.num_running, core.num_waiting) == (0, 0)


def test_decoding_streams_do_not_keep_a_new_request_from_starting() -> None:
    runner = RecordingRunner()
    core = make_core(runner, max_batched_tokens=4, max_prefill_tokens=64)
    outputs: Outputs = defaultdict(list)
    for i in range(6):
        core.add(make_request(f"decoder{i}", "d", max_new_tokens=50))
    while not all(outputs[f"decoder{i}"] for i in range(6)):
        step(core, outputs)
    core.add(make_request("newcomer", "abcdefgh", max_new_tokens=1))
    step(core, outputs)
    assert any(chunk.request_id == "newcomer" for chunk in runner.steps[-1])
    assert sum(1 for chunk in runner.steps[-1] if chunk.request_id.startswith("decoder")) == 6
