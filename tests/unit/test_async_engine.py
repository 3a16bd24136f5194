"""engine.async_engine.AsyncEngine around an EngineCore with the scripted fake runner."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from fakes import EOS_ID, VOCAB_SIZE, FakeRunner, FakeTokenizer, make_core, make_request

from switchboard.engine.async_engine import AsyncEngine, ModelInfo
from switchboard.engine.config import EngineLimits
from switchboard.engine.core import EngineCore
from switchboard.engine.errors import EngineDead, InvalidRequest, Overloaded, RequestTimedOut
from switchboard.engine.request import FinishReason, RequestOutput

LIMITS = EngineLimits(vocab_size=VOCAB_SIZE, max_seq_len=64, max_input_len=63, max_iter_times=64,
                      max_token_bytes=8)
INFO = ModelInfo(source="fake", device="cpu", dtype="float32", vocab_size=VOCAB_SIZE,
                 eos_token_ids=frozenset({EOS_ID}), num_kv_blocks=256, block_size=4,
                 special_token_ids=frozenset({EOS_ID}), kv_cache_bytes=256 * 4 * 64,
                 max_batch_size=8, max_waiting_requests=4)
ENDLESS = 10**6  # max_new_tokens of a request that only ends when it is aborted


def make_engine(core: EngineCore, max_unfinished: int = 8, **options: object) -> AsyncEngine:
    """options: AsyncEngine's own (guides, slots_per_request)."""
    return AsyncEngine(core, FakeTokenizer(), LIMITS, INFO, max_unfinished, **options)


def run_with_engine(scenario: Callable[[AsyncEngine], Awaitable[None]], core: EngineCore,
                    max_unfinished: int = 8, **options: object) -> None:
    """Run `scenario` against a started engine, shutting it down afterwards."""

    async def main() -> None:
        engine = make_engine(core, max_unfinished, **options)
        engine.start(asyncio.get_running_loop())
        try:
            await asyncio.wait_for(scenario(engine), timeout=10)
        finally:
            await engine.shutdown()

    asyncio.run(main())


async def collect(stream: AsyncIterator[RequestOutput]) -> list[RequestOutput]:
    return [output async for output in stream]


async def eventually(condition: Callable[[], bool], timeout_s: float = 2.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition did not become true in time")


async def start_blocked(engine: AsyncEngine, runner: FakeRunner,
                        names: list[str]) -> list[asyncio.Task[list[RequestOutput]]]:
    """Start requests that stay in flight while `runner.gate` is closed."""
    requests = [make_request(name, name, max_new_tokens=2) for name in names]
    tasks = [asyncio.create_task(collect(engine.generate(request))) for request in requests]
    await eventually(lambda: len(runner.calls) > 0)  # the engine thread is blocked in prefill
    return tasks


def test_generate_yields_the_events_and_stops_after_the_finished_one() -> None:
    async def scenario(engine: AsyncEngine) -> None:
        outputs = await collect(engine.generate(make_request("r", "p", max_new_tokens=3)))
        assert [output.text for output in outputs] == ["a", "b", "c"]
        assert [output.finish_reason for output in outputs] == [None, None, FinishReason.LENGTH]
        assert engine.is_healthy

    run_with_engine(scenario, make_core())


def test_a_caller_that_answers_at_the_end_gets_the_events_together_once_the_request_ended(
        ) -> None:
    runner = FakeRunner()

    async def scenario(engine: AsyncEngine) -> None:
        events = engine.generate(make_request("r", "p", max_new_tokens=3), streamed=False)
        first = await anext(events)
        steps_run_by_then = len(runner.calls)
        outputs = [first, *await collect(events)]
        assert [output.text for output in outputs] == ["a", "b", "c"]
        assert [output.finish_reason for output in outputs] == [None, None, FinishReason.LENGTH]
        assert steps_run_by_then == 3  # the prefill, which gives "a", then two decode steps

    run_with_engine(scenario, make_core(runner))


def test_leaving_the_iteration_early_aborts_the_request() -> None:
    core = make_core()

    async def scenario(engine: AsyncEngine) -> None:
        request = make_request("r", "p", max_new_tokens=ENDLESS)
        async with contextlib.aclosing(engine.generate(request)) as stream:
            async for output in stream:
                assert output.text == "a"
                break
        await eventually(lambda: not core.has_work())
        assert (core.num_running, core.num_waiting) == (0, 0)
        outputs = await collect(engine.generate(make_request("next", "p", max_new_tokens=1)))
        assert outputs[-1].finish_reason is FinishReason.LENGTH

    run_with_engine(scenario, core)


def test_a_reused_request_id_gets_only_its_own_events() -> None:
    runner = FakeRunner(scripts={"q": "q"})

    async def scenario(engine: AsyncEngine) -> None:
        request = make_request("r", "p", max_new_tokens=ENDLESS)
        async with contextlib.aclosing(engine.generate(request)) as stream:
            await anext(stream)
            # Block the loop while the engine thread runs a few more steps of "r": their
            # events wait in the loop's queue.
            steps = len(runner.calls)
            deadline = time.monotonic() + 2
            while len(runner.calls) < steps + 5 and time.monotonic() < deadline:
                time.sleep(0.001)
        outputs = await collect(engine.generate(make_request("r", "q", max_new_tokens=1)))
        assert [output.text for output in outputs] == ["q"]

    run_with_engine(scenario, make_core(runner))


def test_too_many_requests_in_flight_is_overloaded() -> None:
    runner = FakeRunner(gate=threading.Event())

    async def scenario(engine: AsyncEngine) -> None:
        tasks = await start_blocked(engine, runner, ["a", "b"])
        with pytest.raises(Overloaded, match=r"too many requests in flight \(2\)"):
            await anext(engine.generate(make_request("c", "c")))
        runner.gate.set()
        for task in tasks:
            assert (await task)[-1].finish_reason is FinishReason.LENGTH
        outputs = await collect(engine.generate(make_request("c", "c", max_new_tokens=1)))
        assert outputs[-1].finish_reason is FinishReason.LENGTH

    run_with_engine(scenario, make_core(runner), max_unfinished=2)


def test_a_probe_in_flight_does_not_count_against_the_in_flight_limit() -> None:
    runner = FakeRunner(gate=threading.Event())

    async def scenario(engine: AsyncEngine) -> None:
        probe = dataclasses.replace(make_request("probe", "p", max_new_tokens=2), probe=True)
        tasks = [asyncio.create_task(collect(engine.generate(probe))),
                 *await start_blocked(engine, runner, ["a"])]
        tasks.append(asyncio.create_task(collect(engine.generate(make_request("b", "b")))))
        runner.gate.set()
        for task in tasks:
            assert (await task)[-1].finish_reason is FinishReason.LENGTH

    run_with_engine(scenario, make_core(runner), max_unfinished=2)


def test_a_probe_is_not_refused_when_too_many_requests_are_in_flight() -> None:
    runner = FakeRunner(gate=threading.Event())

    async def scenario(engine: AsyncEngine) -> None:
        tasks = await start_blocked(engine, runner, ["a", "b"])
        probe = asyncio.create_task(collect(engine.generate(dataclasses.replace(
            make_request("probe", "p", max_new_tokens=1), probe=True))))
        runner.gate.set()
        assert (await probe)[-1].finish_reason is FinishReason.LENGTH
        for task in tasks:
            await task

    run_with_engine(scenario, make_core(runner), max_unfinished=2)


def test_a_request_id_in_use_is_rejected() -> None:
    runner = FakeRunner(gate=threading.Event())

    async def scenario(engine: AsyncEngine) -> None:
        [task] = await start_blocked(engine, runner, ["a"])
        with pytest.raises(InvalidRequest) as caught:
            await anext(engine.generate(make_request("a", "b")))
        assert caught.value.field == "id"
        assert "'a' is already in use" in caught.value.reason
        runner.gate.set()
        assert [output.text for output in await task] == ["a", "b"]

    run_with_engine(scenario, make_core(runner))


def test_a_timed_out_request_raises_from_the_iterator() -> None:
    core = make_core(FakeRunner(step_delay_s=0.005))

    async def scenario(engine: AsyncEngine) -> None:
        request = make_request("r", "p", max_new_tokens=ENDLESS, timeout_s=0.05)
        with pytest.raises(RequestTimedOut, match="timed out after 0.05 s"):
            await collect(engine.generate(request))
        await eventually(lambda: not core.has_work())

    run_with_engine(scenario, core)


def test_after_shutdown_the_engine_is_unhealthy_and_refuses_requests() -> None:
    async def main() -> None:
        engine = make_engine(make_core())
        engine.start(asyncio.get_running_loop())
        assert engine.is_healthy
        await engine.shutdown()
        assert not engine.is_healthy
        with pytest.raises(EngineDead, match="not running"):
            await anext(engine.generate(make_request("r")))

    asyncio.run(main())


def test_an_engine_that_was_never_started_refuses_requests() -> None:
    async def main() -> None:
        engine = make_engine(make_core())
        assert not engine.is_healthy
        with pytest.raises(EngineDead):
            await anext(engine.generate(make_request("r")))

    asyncio.run(main())


def test_ready_waits_for_the_warm_up_on_the_engine_thread_and_so_do_requests() -> None:
    warm = threading.Event()
    warmed_on: list[str] = []

    def warm_up() -> None:
        warmed_on.append(threading.current_thread().name)
        assert warm.wait(5)

    async def main() -> None:
        engine = AsyncEngine(make_core(), FakeTokenizer(), LIMITS, INFO, 8, warm_up=warm_up)
        engine.start(asyncio.get_running_loop())
        early = asyncio.create_task(collect(engine.generate(make_request("r", max_new_tokens=3))))
        ready = asyncio.create_task(engine.wait_ready())
        await asyncio.sleep(0.05)
        assert not ready.done() and not early.done()
        warm.set()
        await asyncio.wait_for(ready, timeout=5)
        assert len(await asyncio.wait_for(early, timeout=5)) == 3
        await engine.shutdown()

    asyncio.run(main())
    assert warmed_on == ["engine-core"]


def test_a_failed_warm_up_leaves_the_engine_dead() -> None:
    def warm_up() -> None:
        raise RuntimeError("scripted warm-up failure")

    async def main() -> None:
        engine = AsyncEngine(make_core(), FakeTokenizer(), LIMITS, INFO, 8, warm_up=warm_up)
        engine.start(asyncio.get_running_loop())
        with pytest.raises(EngineDead, match="failed to start"):
            await asyncio.wait_for(engine.wait_ready(), timeout=5)
        assert not engine.is_healthy
        await engine.shutdown()

    asyncio.run(main())


def test_when_the_engine_loop_dies_requests_in_flight_get_engine_dead() -> None:
    core = make_core()
    exploded = threading.Event()
    step = core.step

    def exploding_step() -> list[RequestOutput]:
        if exploded.is_set():
            raise RuntimeError("scripted engine loop failure")
        return step()

    core.step = exploding_step

    async def scenario(engine: AsyncEngine) -> None:
        stream = engine.generate(make_request("r", "p", max_new_tokens=ENDLESS))
        await anext(stream)
        exploded.set()
        with pytest.raises(EngineDead, match="the engine stopped"):
            await collect(stream)
        assert not engine.is_healthy
        with pytest.raises(EngineDead):
            await anext(engine.generate(make_request("next")))

    run_with_engine(scenario, core)


def test_a_request_in_flight_at_shutdown_ends_with_engine_dead() -> None:
    runner = FakeRunner(gate=threading.Event())

    async def main() -> None:
        engine = make_engine(make_core(runner))
        engine.start(asyncio.get_running_loop())
        request = make_request("r", "p", max_new_tokens=ENDLESS)
        consumer = asyncio.create_task(collect(engine.generate(request)))
        await eventually(lambda: len(runner.calls) > 0)  # the engine thread is in prefill
        shutdown = asyncio.create_task(engine.shutdown())
        await asyncio.sleep(0.05)
        runner.gate.set()
        await shutdown
        with pytest.raises(EngineDead):
            await asyncio.wait_for(consumer, timeout=1)

    asyncio.run(main())
