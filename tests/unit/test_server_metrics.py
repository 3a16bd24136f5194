"""server.metrics (Prometheus exposition, per-request measures, MindIE's moving averages) and
server.served_model (requests in flight, graceful stop), with a fake engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from switchboard.engine.config import EngineLimits
from switchboard.engine.core import EngineStats
from switchboard.engine.errors import EngineDead, RequestTimedOut
from switchboard.engine.params import GenerationRequest
from switchboard.engine.request import FinishReason, RequestOutput, RequestTimings
from switchboard.engine.validation import build_request
from switchboard.server.metrics import MOVING_AVERAGE_REQUESTS, RequestRecorder, ServerMetrics
from switchboard.server.served_model import ServedModel

MODEL = "m"
STATS = EngineStats(num_free_blocks=25, num_total_blocks=100, num_waiting=3, num_running=2,
                    num_preemptions=4, block_size=16, max_batch_size=8, num_steps=12,
                    num_drafts=5, num_draft_tokens=15, num_accepted_tokens=9,
                    num_accepted_tokens_per_position=(5, 3, 1))
LIMITS = EngineLimits(vocab_size=100, max_seq_len=64, max_input_len=63, max_iter_times=64,
                      max_token_bytes=8)


def families(metrics: ServerMetrics) -> dict[str, list]:
    """Scraped samples by family name (`_created` series parse as families of their own)."""
    return {family.name: family.samples
            for family in text_string_to_metric_families(metrics.exposition())}


def value(metrics: ServerMetrics, sample: str, **labels: str) -> float:
    """A sample's value for model MODEL; 0 where the series does not exist (never counted)."""
    for samples in families(metrics).values():
        for found in samples:
            if found.name == sample and found.labels == {"model_name": MODEL, **labels}:
                return found.value
    return 0.0


def output(new_token_ids: tuple[int, ...], num_generated: int, *, index: int = 0,
           finish: FinishReason | None = None, cached: int = 0) -> RequestOutput:
    return RequestOutput(
        request_id="r1", new_token_ids=new_token_ids, text="x", num_prompt_tokens=5,
        num_generated_tokens=num_generated, seed=7, finish_reason=finish, num_cached_tokens=cached,
        timings=RequestTimings(queue_wait=0.002, first_token=0.02, step_time=time.monotonic(),
                               token_latency=0.01, batch_size=1),
        index=index)


# The vLLM families dashboards read, by our measure (written out here, not taken from the code
# under test, so that a dropped or misspelt alias fails).
VLLM_FAMILIES = {
    "e2e_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
    "generation_tokens": ("vllm:generation_tokens",),
    "inter_token_latency_seconds": ("vllm:inter_token_latency_seconds",),
    "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "num_preemptions": ("vllm:num_preemptions",),
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "prefix_cache_hits": ("vllm:prefix_cache_hits",),
    "spec_decode_num_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens",),
    "spec_decode_num_accepted_tokens_per_pos": ("vllm:spec_decode_num_accepted_tokens_per_pos",),
    "spec_decode_num_draft_tokens": ("vllm:spec_decode_num_draft_tokens",),
    "spec_decode_num_drafts": ("vllm:spec_decode_num_drafts",),
    "prefix_cache_queries": ("vllm:prefix_cache_queries",),
    "prompt_tokens": ("vllm:prompt_tokens",),
    "request_generation_tokens": ("vllm:request_generation_tokens",),
    "request_prompt_tokens": ("vllm:request_prompt_tokens",),
    "request_queue_time_seconds": ("vllm:request_queue_time_seconds",),
    "request_success": ("vllm:request_success",),
    "time_per_output_token_seconds": ("vllm:time_per_output_token_seconds",),
    "time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
}

# MindIE's families (its prometheus_metrics.cpp), by our measure, written out likewise.
MINDIE_FAMILIES = {
    "e2e_request_latency_seconds": "e2e_request_latency_seconds",
    "generation_tokens": "generation_tokens",
    "kv_cache_usage_perc": "npu_cache_usage_perc",
    "num_preemptions": "num_preemptions",
    "num_requests_running": "num_requests_running",
    "num_requests_waiting": "num_requests_waiting",
    "prompt_tokens": "prompt_tokens",
    "request_failure": "request_failed",
    "request_generation_tokens": "request_generation_tokens",
    "request_prompt_tokens": "request_prompt_tokens",
    "request_success": "request_success",
    "time_per_output_token_seconds": "time_per_output_token_seconds",
    "time_to_first_token_seconds": "time_to_first_token_seconds",
}

def three_tokens() -> tuple[RequestOutput, ...]:
    """A request's events, from steps that end now (the recorder measures time to the first
    token from its step's end)."""
    return (output((11,), 1), output((12,), 2),
            output((13,), 3, finish=FinishReason.LENGTH, cached=4))


THREE_TOKENS = three_tokens()


def answer_three_tokens(metrics: ServerMetrics) -> RequestRecorder:
    """A request recorded as answered with three_tokens()."""
    recorder = metrics.start_request()
    for event in three_tokens():
        recorder.event(event)
    recorder.finished()
    return recorder


def test_every_measure_is_exported_under_our_name_and_vllms() -> None:
    metrics = ServerMetrics(MODEL, lambda: STATS)
    metrics.start_request().close()  # so request_success has a series
    scraped = families(metrics)
    for name, vllm_names in VLLM_FAMILIES.items():
        for exported in (f"switchboard_{name}", *vllm_names):
            assert scraped[exported], exported
            assert all(sample.labels["model_name"] == MODEL for sample in scraped[exported])
    assert value(metrics, "vllm:gpu_cache_usage_perc") == value(
        metrics, "vllm:kv_cache_usage_perc") == 0.75
    assert scraped["switchboard_server_process_resident_memory_bytes"][0].value > 0


def test_mindies_unprefixed_names_are_exported_too() -> None:
    metrics = ServerMetrics(MODEL, lambda: STATS)
    metrics.start_request().close()
    failed = metrics.start_request()
    failed.failed(RequestTimedOut("timed out"))
    scraped = families(metrics)
    for name, mindie_name in MINDIE_FAMILIES.items():
        assert scraped[mindie_name], mindie_name
        assert [sample.value for sample in scraped[mindie_name]] == [
            sample.value for sample in scraped[f"switchboard_{name}"]], name
    assert value(metrics, "npu_cache_usage_perc") == 0.75
    assert value(metrics, "request_failed_total", reason="deadline_exceeded") == 1


def test_tritons_counters_come_from_the_same_totals_under_its_names() -> None:
    metrics = ServerMetrics(MODEL, lambda: STATS)
    answer_three_tokens(metrics)
    metrics.start_request().close()  # the client left: a failure
    totals = metrics.totals
    triton = {sample.name: sample for family in text_string_to_metric_families(
        metrics.exposition()) for sample in family.samples if sample.name.startswith("nv_")}
    assert {name: sample.value for name, sample in triton.items()} == {
        "nv_inference_request_success": 1, "nv_inference_request_failure": 1,
        "nv_inference_count": 1, "nv_inference_exec_count": STATS.num_steps,
        "nv_inference_request_duration_us": (totals.success.ns + totals.fail.ns) // 1000,
        "nv_inference_queue_duration_us": 2000,  # the events' queue_wait, 2 ms
        "nv_inference_compute_infer_duration_us": totals.compute_infer.ns // 1000,
        "nv_inference_pending_request_count": STATS.num_waiting}
    assert all(sample.labels == {"model": MODEL, "version": "1"} for sample in triton.values())


def test_measures_vllm_lacks_have_no_vllm_alias() -> None:
    scraped = families(ServerMetrics(MODEL, lambda: STATS))
    for name in ("request_failure", "kv_cache_free_blocks", "kv_cache_total_blocks"):
        assert f"switchboard_{name}" in scraped
        assert f"vllm:{name}" not in scraped
    vllm_exported = {name for name in scraped
                     if name.startswith("vllm:") and not name.endswith("_created")}
    assert vllm_exported == {name for names in VLLM_FAMILIES.values() for name in names}


def test_engine_load_is_absent_before_the_model_is_loaded_then_read_when_scraped() -> None:
    stats: list[EngineStats | None] = [None]
    metrics = ServerMetrics(MODEL, lambda: stats[0])
    load = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
            "kv_cache_free_blocks", "kv_cache_total_blocks", "num_preemptions")
    assert not {f"switchboard_{name}" for name in load} & families(metrics).keys()
    stats[0] = STATS
    assert [value(metrics, f"switchboard_{name}") for name in load[:-1]] == [2, 3, 0.75, 25, 100]
    assert value(metrics, "switchboard_num_preemptions_total") == 4
    assert [value(metrics, f"vllm:spec_decode_num_{name}_total")
            for name in ("drafts", "draft_tokens", "accepted_tokens")] == [5, 15, 9]
    assert [value(metrics, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                  position=str(position)) for position in range(4)] == [5, 3, 1, 0]


def test_a_finished_request_is_measured() -> None:
    metrics = ServerMetrics(MODEL, lambda: None)
    answer_three_tokens(metrics).close()  # ends every request; must not count it again
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                      "time_per_output_token_seconds", "request_queue_time_seconds"):
        assert value(metrics, f"switchboard_{histogram}_count") == 1, histogram
    # One gap per token after the first.
    assert value(metrics, "switchboard_inter_token_latency_seconds_count") == 2
    assert value(metrics, "switchboard_request_success_total", finished_reason="length") == 1
    assert value(metrics, "switchboard_request_success_total", finished_reason="abort") == 0
    assert value(metrics, "switchboard_prompt_tokens_total") == 5
    assert value(metrics, "switchboard_generation_tokens_total") == 3
    assert value(metrics, "vllm:generation_tokens_total") == 3
    assert value(metrics, "switchboard_prefix_cache_queries_total") == 5
    assert value(metrics, "switchboard_prefix_cache_hits_total") == 4
    assert metrics.mean_time_to_first_token > 0
    assert metrics.mean_time_between_tokens > 0


def test_a_request_the_client_left_counts_as_abort() -> None:
    metrics = ServerMetrics(MODEL, lambda: None)
    recorder = metrics.start_request()
    recorder.event(THREE_TOKENS[0])
    recorder.close()
    assert value(metrics, "switchboard_request_success_total", finished_reason="abort") == 1
    assert value(metrics, "switchboard_e2e_request_latency_seconds_count") == 0


def test_a_failed_request_counts_as_failure_by_grpc_status_not_success() -> None:
    metrics = ServerMetrics(MODEL, lambda: None)
    recorder = metrics.start_request()
    recorder.event(THREE_TOKENS[0])
    recorder.failed(RequestTimedOut("timed out"))
    recorder.close()
    assert value(metrics, "switchboard_request_failure_total", reason="deadline_exceeded") == 1
    assert not families(metrics)["switchboard_request_success"]


def test_triton_totals_time_successes_and_count_the_rest_as_failures() -> None:
    metrics = ServerMetrics(MODEL, lambda: None)
    answer_three_tokens(metrics).close()
    failed = metrics.start_request()
    failed.event(THREE_TOKENS[0])
    failed.failed(RequestTimedOut("timed out"))
    failed.close()
    metrics.start_request().close()  # the client left
    totals = metrics.totals
    assert (totals.success.count, totals.fail.count) == (1, 2)
    assert totals.queue.count == totals.compute_infer.count == 1
    assert totals.queue.ns == 2_000_000  # the events' queue_wait
    assert abs(totals.queue.ns + totals.compute_infer.ns - totals.success.ns) <= 1
    assert abs(totals.last_inference_ms / 1000 - time.time()) < 5


def test_generation_tokens_of_n_sequences_add_up() -> None:
    metrics = ServerMetrics(MODEL, lambda: None)
    recorder = metrics.start_request()
    for event in (output((11,), 1), output((21,), 1, index=1), output((12,), 2),
                  output((22,), 2, index=1, finish=FinishReason.EOS),
                  output((13,), 3, finish=FinishReason.LENGTH)):
        recorder.event(event)
    recorder.finished()
    assert value(metrics, "switchboard_generation_tokens_total") == 5
    assert value(metrics, "switchboard_request_generation_tokens_sum") == 5
    # A sequence's first token is no gap: 2 gaps in sequence 0, 1 in sequence 1.
    assert value(metrics, "switchboard_inter_token_latency_seconds_count") == 3
    assert value(metrics, "switchboard_request_queue_time_seconds_count") == 1
    # The first sequence to end gives the reason, by vLLM's name ("stop" for eos_token).
    assert value(metrics, "switchboard_request_success_total", finished_reason="stop") == 1


def test_moving_averages_keep_only_the_last_1000_requests() -> None:
    metrics = ServerMetrics(MODEL, lambda: None)
    assert (metrics.mean_time_to_first_token, metrics.mean_time_between_tokens) == (0.0, 0.0)

    def record(first_token_at: float, gap: float) -> None:
        recorder = RequestRecorder(metrics, start=0.0)
        recorder.first_token_at, recorder.longest_sequence = first_token_at, 2
        recorder.finish_reason = "length"
        metrics.observe_finished(recorder, now=first_token_at + gap)

    for _ in range(MOVING_AVERAGE_REQUESTS):
        record(2.0, 1.0)
    for _ in range(MOVING_AVERAGE_REQUESTS - 1):
        record(0.5, 0.1)
    assert metrics.mean_time_to_first_token == pytest.approx((2.0 + 999 * 0.5) / 1000)
    record(0.5, 0.1)
    assert metrics.mean_time_to_first_token == pytest.approx(0.5)
    assert metrics.mean_time_between_tokens == pytest.approx(0.1)


class FakeEngine:
    """Yields its first event, then waits for `proceed` before the rest."""

    is_healthy = True

    def __init__(self, events: tuple[RequestOutput, ...] = THREE_TOKENS) -> None:
        self.events = events
        self.proceed = asyncio.Event()
        self.stream_closed = False

    def stats(self) -> EngineStats:
        return STATS

    async def generate(self, spec: GenerationRequest, prefilled: object = None, *,
                       streamed: bool = True) -> AsyncIterator[RequestOutput]:
        try:
            yield self.events[0]
            await self.proceed.wait()
            for event in self.events[1:]:
                yield event
        finally:
            self.stream_closed = True


def spec(request_id: str = "r1") -> GenerationRequest:
    return build_request(request_id, [1, 2, 3], {"max_new_tokens": 3}, LIMITS)


def loaded_model() -> tuple[ServedModel, FakeEngine]:
    model, engine = ServedModel(MODEL), FakeEngine()
    model.engine = engine
    return model, engine


async def yield_control() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_generate_yields_the_engines_events_and_measures_them() -> None:
    async def main() -> None:
        model, engine = loaded_model()
        engine.proceed.set()
        assert [event async for event in model.generate(spec(), "")] == list(THREE_TOKENS)
        assert value(model.metrics, "switchboard_request_success_total",
                     finished_reason="length") == 1
        assert value(model.metrics, "switchboard_num_requests_waiting") == 3

    asyncio.run(main())


def test_an_engine_error_counts_as_failure_and_reaches_the_caller() -> None:
    class FailingEngine(FakeEngine):
        async def generate(self, spec: GenerationRequest, prefilled: object = None, *,
                           streamed: bool = True) -> AsyncIterator[RequestOutput]:
            yield self.events[0]
            raise RequestTimedOut("timed out")

    async def main() -> None:
        model = ServedModel(MODEL)
        model.engine = FailingEngine()
        with pytest.raises(RequestTimedOut):
            _ = [event async for event in model.generate(spec(), "")]
        assert value(model.metrics, "switchboard_request_failure_total",
                     reason="deadline_exceeded") == 1
        assert not families(model.metrics)["switchboard_request_success"]

    asyncio.run(main())


def test_readiness_needs_a_healthy_engine() -> None:
    model = ServedModel(MODEL)
    assert not model.is_ready
    model.engine = FakeEngine()
    assert model.is_ready
    model.engine.is_healthy = False
    assert not model.is_ready


def test_after_begin_stop_new_requests_are_refused() -> None:
    async def main() -> None:
        model, _ = loaded_model()
        assert model.begin_stop() is True
        assert model.begin_stop() is False
        assert not model.is_ready
        with pytest.raises(EngineDead) as caught:
            await anext(model.generate(spec(), ""))
        assert caught.value.message.startswith("the server is stopping")

    asyncio.run(main())


def test_drained_waits_for_every_request_in_flight_which_still_complete() -> None:
    async def main() -> None:
        model, engine = loaded_model()
        first, second = (model.generate(spec(request_id), "client-1")
                         for request_id in ("r1", "r2"))
        assert await anext(first) == await anext(second) == THREE_TOKENS[0]
        assert model.request_ids("client-1") == {"r1", "r2"}
        model.begin_stop()
        drained = asyncio.create_task(model.drained())
        await yield_control()
        assert not drained.done()
        engine.proceed.set()
        assert [event async for event in first] == list(THREE_TOKENS[1:])
        await yield_control()
        assert not drained.done()
        assert model.request_ids("client-1") == {"r2"}
        assert [event async for event in second] == list(THREE_TOKENS[1:])
        await asyncio.wait_for(drained, timeout=1)
        assert model.request_ids("client-1") == frozenset()

    asyncio.run(main())


def test_a_request_abandoned_midway_counts_as_abort_and_leaves_nothing_in_flight() -> None:
    async def main() -> None:
        model, engine = loaded_model()
        stream = model.generate(spec("r1"), "client-1")
        await anext(stream)
        await stream.aclose()
        assert engine.stream_closed  # so the engine can abort the request
        assert model.request_ids("client-1") == frozenset()
        await asyncio.wait_for(model.drained(), timeout=1)
        assert value(model.metrics, "switchboard_request_success_total",
                     finished_reason="abort") == 1

    asyncio.run(main())
