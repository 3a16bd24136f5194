"""The server's Prometheus metrics.

What each request took is recorded as its events pass (`RequestRecorder`); the engine's load
is read when scraped. Cumulative totals in Triton's terms (`InferenceTotals`) feed KServe's
ModelStatistics. Every metric is exported under our own name (`switchboard_*`) and, where
vLLM or MindIE exports the same measure, under their names too (MindIE's are vLLM's V0 names
without the `vllm:` prefix), so that dashboards and load-aware routers built for either read
Switchboard unchanged. Triton's `nv_inference_*` counters come from the same totals as KServe's
ModelStatistics. The moving averages of MindIE's /metrics-json are
kept here as well.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import prometheus_client
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from switchboard.engine.core import EngineStats
from switchboard.engine.errors import EngineError
from switchboard.engine.request import RequestOutput
from switchboard.server.errors import status_for
from switchboard.server.model_info import MODEL_VERSION
from switchboard.server.triton_vllm import FINISH_REASONS as VLLM_FINISH_REASONS

OWN_PREFIX = "switchboard_"
# Our base name → vLLM's names for the same measure.
VLLM_NAMES: dict[str, tuple[str, ...]] = {
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "num_preemptions": ("vllm:num_preemptions",),
    "spec_decode_num_drafts": ("vllm:spec_decode_num_drafts",),
    "spec_decode_num_draft_tokens": ("vllm:spec_decode_num_draft_tokens",),
    "spec_decode_num_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens",),
    "spec_decode_num_accepted_tokens_per_pos": ("vllm:spec_decode_num_accepted_tokens_per_pos",),
    "prompt_tokens": ("vllm:prompt_tokens",),
    "generation_tokens": ("vllm:generation_tokens",),
    "request_success": ("vllm:request_success",),
    "prefix_cache_queries": ("vllm:prefix_cache_queries",),
    "prefix_cache_hits": ("vllm:prefix_cache_hits",),
    "time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
    "time_per_output_token_seconds": ("vllm:time_per_output_token_seconds",),
    "inter_token_latency_seconds": ("vllm:inter_token_latency_seconds",),
    "e2e_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
    "request_queue_time_seconds": ("vllm:request_queue_time_seconds",),
    "request_prompt_tokens": ("vllm:request_prompt_tokens",),
    "request_generation_tokens": ("vllm:request_generation_tokens",),
}
# Our base name → MindIE's names for the same measure (its prometheus_metrics.cpp).
MINDIE_NAMES: dict[str, tuple[str, ...]] = {
    "num_requests_running": ("num_requests_running",),
    "num_requests_waiting": ("num_requests_waiting",),
    "kv_cache_usage_perc": ("npu_cache_usage_perc",),
    "num_preemptions": ("num_preemptions",),
    "prompt_tokens": ("prompt_tokens",),
    "generation_tokens": ("generation_tokens",),
    "request_success": ("request_success",),
    "request_failure": ("request_failed",),
    "time_to_first_token_seconds": ("time_to_first_token_seconds",),
    "time_per_output_token_seconds": ("time_per_output_token_seconds",),
    "e2e_request_latency_seconds": ("e2e_request_latency_seconds",),
    "request_prompt_tokens": ("request_prompt_tokens",),
    "request_generation_tokens": ("request_generation_tokens",),
}
# MindIE's /metrics-json averages over the last 1000 requests.
MOVING_AVERAGE_REQUESTS = 1000
FIRST_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                       120.0, 300.0, 600.0)
TOKEN_GAP_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                     2.5, 5.0, 10.0)
REQUEST_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0,
                   1200.0, 3600.0)
TOKEN_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)


@dataclass(slots=True)
class Duration:
    """How many times something happened and its total time, in nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += round(seconds * 1e9)


@dataclass(slots=True)
class InferenceTotals:
    """Requests so far as Triton's statistics extension counts them: success and fail, from
    arrival to end (a request whose client left failed); for successes only, queue (arrival
    to first scheduled) and compute_infer (first scheduled to end). last_inference_ms: when
    the last request ended, in milliseconds since the epoch (0: none yet)."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    last_inference_ms: int = 0

    def ended(self) -> None:
        self.last_inference_ms = time.time_ns() // 1_000_000


class ServerMetrics:
    """The metrics of one served model. `stats` reads the engine's load (None before it is
    loaded)."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats | None]) -> None:
        self.model_name = model_name
        self._measures = prometheus_client.CollectorRegistry(auto_describe=False)
        self._measures.register(EngineLoadCollector(model_name, stats))

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]
                      ) -> prometheus_client.Histogram:
            return prometheus_client.Histogram(name, documentation, ("model_name",),
                                               buckets=buckets, registry=self._measures
                                               ).labels(model_name)

        def counter(name: str, documentation: str) -> prometheus_client.Counter:
            return prometheus_client.Counter(name, documentation, ("model_name",),
                                             registry=self._measures).labels(model_name)

        self.time_to_first_token = histogram(
            "time_to_first_token_seconds", "From a request's arrival to its first token",
            FIRST_TOKEN_BUCKETS)
        self.time_per_output_token = histogram(
            "time_per_output_token_seconds",
            "Per request: time after the first token divided by the tokens after it",
            TOKEN_GAP_BUCKETS)
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds", "Time between consecutive tokens of a sequence",
            TOKEN_GAP_BUCKETS)
        self.e2e_latency = histogram(
            "e2e_request_latency_seconds", "From a request's arrival to its last token",
            REQUEST_BUCKETS)
        self.queue_time = histogram(
            "request_queue_time_seconds", "From a request's arrival until it was first scheduled",
            REQUEST_BUCKETS)
        self.request_prompt_tokens = histogram(
            "request_prompt_tokens", "Prompt tokens of each finished request", TOKEN_COUNT_BUCKETS)
        self.request_generation_tokens = histogram(
            "request_generation_tokens", "Tokens generated for each finished request (all its "
            "sequences)", TOKEN_COUNT_BUCKETS)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "Tokens generated")
        self.prefix_cache_queries = counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache")
        self.prefix_cache_hits = counter(
            "prefix_cache_hits", "Prompt tokens whose KV cache was reused from the prefix cache")
        self._success = prometheus_client.Counter(
            "request_success", "Requests that ended, by vLLM's finish reason (stop, length, "
            "or abort: stopped, or the client left)",
            ("model_name", "finished_reason"), registry=self._measures)
        self._failure = prometheus_client.Counter(
            "request_failure", "Requests that failed, by gRPC status",
            ("model_name", "reason"), registry=self._measures)
        self._first_token_times: collections.deque[float] = collections.deque(
            maxlen=MOVING_AVERAGE_REQUESTS)
        self._token_gaps: collections.deque[float] = collections.deque(
            maxlen=MOVING_AVERAGE_REQUESTS)
        self.totals = InferenceTotals()

        self._exported = prometheus_client.CollectorRegistry(auto_describe=False)
        self._exported.register(ExportedNames(self._measures))
        self._exported.register(TritonCounters(model_name, self.totals, stats))
        prometheus_client.ProcessCollector(namespace="switchboard_server", registry=self._exported)

    def exposition(self) -> str:
        return prometheus_client.generate_latest(self._exported).decode()

    def start_request(self) -> RequestRecorder:
        return RequestRecorder(self, time.monotonic())

    @property
    def mean_time_to_first_token(self) -> float:
        return _mean(self._first_token_times)

    @property
    def mean_time_between_tokens(self) -> float:
        return _mean(self._token_gaps)

    def observe_finished(self, recorder: RequestRecorder, now: float) -> None:
        self.e2e_latency.observe(now - recorder.start)
        self.totals.success.add(now - recorder.start)
        self.totals.queue.add(recorder.queue_wait)
        self.totals.compute_infer.add(now - recorder.start - recorder.queue_wait)
        self.totals.ended()
        self.request_prompt_tokens.observe(recorder.num_prompt_tokens)
        self.request_generation_tokens.observe(recorder.num_generated_tokens)
        self.prompt_tokens.inc(recorder.num_prompt_tokens)
        self.generation_tokens.inc(recorder.num_generated_tokens)
        self.prefix_cache_queries.inc(recorder.num_prompt_tokens)
        self.prefix_cache_hits.inc(recorder.num_cached_tokens)
        self._success.labels(self.model_name, recorder.finish_reason).inc()
        if recorder.first_token_at is not None:
            self._first_token_times.append(recorder.first_token_at - recorder.start)
            if recorder.longest_sequence > 1:
                gap = (now - recorder.first_token_at) / (recorder.longest_sequence - 1)
                self.time_per_output_token.observe(gap)
                self._token_gaps.append(gap)

    def count_aborted(self, recorder: RequestRecorder, now: float) -> None:
        self._success.labels(self.model_name, "abort").inc()
        self._count_unsuccessful(recorder, now)

    def count_failed(self, error: EngineError, recorder: RequestRecorder, now: float) -> None:
        self._failure.labels(self.model_name, status_for(error).name.lower()).inc()
        self._count_unsuccessful(recorder, now)

    def _count_unsuccessful(self, recorder: RequestRecorder, now: float) -> None:
        self.totals.fail.add(now - recorder.start)
        self.totals.ended()


class RequestRecorder:
    """One request's measures, fed with its events; ended by `finished`, `failed`, or `close`
    alone (the client went away)."""

    def __init__(self, metrics: ServerMetrics, start: float) -> None:
        self.metrics = metrics
        self.start = start
        self.first_token_at: float | None = None
        self.num_prompt_tokens = 0
        self.num_cached_tokens = 0
        self.num_generated_tokens = 0
        self.longest_sequence = 0
        self.finish_reason = ""
        self.queue_wait = 0.0
        self._started_sequences: set[int] = set()
        self._ended = False

    def event(self, event: RequestOutput) -> None:
        if event.index not in self._started_sequences:
            self._started_sequences.add(event.index)
            if event.index == 0 and event.timings is not None:
                self.queue_wait = event.timings.queue_wait
                self.metrics.queue_time.observe(self.queue_wait)
        elif event.new_token_ids and event.timings is not None:
            self.metrics.inter_token_latency.observe(event.timings.token_latency)
        if event.new_token_ids and self.first_token_at is None:
            # The step's own time: events of an answer given at the end arrive together.
            self.first_token_at = (time.monotonic() if event.timings is None
                                   else event.timings.step_time)
            self.metrics.time_to_first_token.observe(self.first_token_at - self.start)
        if event.finish_reason is not None:
            self.num_prompt_tokens = event.num_prompt_tokens
            self.num_cached_tokens = max(self.num_cached_tokens, event.num_cached_tokens)
            self.num_generated_tokens += event.num_generated_tokens
            self.longest_sequence = max(self.longest_sequence, event.num_generated_tokens)
            self.finish_reason = self.finish_reason or VLLM_FINISH_REASONS[event.finish_reason]

    def finished(self) -> None:
        self._ended = True
        self.metrics.observe_finished(self, time.monotonic())

    def failed(self, error: EngineError) -> None:
        self._ended = True
        self.metrics.count_failed(error, self, time.monotonic())

    def close(self) -> None:
        if not self._ended:
            self._ended = True
            self.metrics.count_aborted(self, time.monotonic())


class EngineLoadCollector(Collector):
    """Gauges of the engine's load, read when scraped; nothing before the model is loaded."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats | None]) -> None:
        self._model_name = model_name
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats is None:
            return
        used = stats.num_total_blocks - stats.num_free_blocks
        for family, value in (
                (GaugeMetricFamily("num_requests_running", "Requests in the running batch",
                                   labels=("model_name",)), stats.num_running),
                (GaugeMetricFamily("num_requests_waiting", "Requests waiting to be scheduled",
                                   labels=("model_name",)), stats.num_waiting),
                (GaugeMetricFamily("kv_cache_usage_perc", "Fraction of KV-cache blocks in use "
                                   "(1 = full)", labels=("model_name",)),
                 used / stats.num_total_blocks if stats.num_total_blocks else 0.0),
                (GaugeMetricFamily("kv_cache_free_blocks", "KV-cache blocks free, cached "
                                   "prefixes no request holds included", labels=("model_name",)),
                 stats.num_free_blocks),
                (GaugeMetricFamily("kv_cache_total_blocks", "KV-cache blocks in the pool",
                                   labels=("model_name",)), stats.num_total_blocks),
                (CounterMetricFamily("num_preemptions", "Requests preempted (KV blocks freed, "
                                     "recomputed later)", labels=("model_name",)),
                 stats.num_preemptions),
                (CounterMetricFamily("spec_decode_num_drafts", "Requests' steps that verified "
                                     "guessed tokens (n-gram speculation)",
                                     labels=("model_name",)), stats.num_drafts),
                (CounterMetricFamily("spec_decode_num_draft_tokens", "Guessed tokens verified",
                                     labels=("model_name",)), stats.num_draft_tokens),
                (CounterMetricFamily("spec_decode_num_accepted_tokens", "Guessed tokens "
                                     "accepted", labels=("model_name",)),
                 stats.num_accepted_tokens)):
            family.add_metric((self._model_name,), value)
            yield family
        if stats.num_accepted_tokens_per_position:
            by_position = CounterMetricFamily(
                "spec_decode_num_accepted_tokens_per_pos", "Guessed tokens accepted, by their "
                "position in the guess (0: the first)", labels=("model_name", "position"))
            for position, count in enumerate(stats.num_accepted_tokens_per_position):
                by_position.add_metric((self._model_name, str(position)), count)
            yield by_position


def execution_count(stats: EngineStats | None) -> int:
    """Triton's execution count: the engine steps so far (0 before the model is loaded)."""
    return 0 if stats is None else stats.num_steps


class TritonCounters(Collector):
    """Triton's per-model inference counters (its metrics.md), labelled model and version,
    under its names, without the `_total` suffix as Triton writes them (hence untyped here:
    prometheus_client gives a counter's samples that suffix)."""

    def __init__(self, model_name: str, totals: InferenceTotals,
                 stats: Callable[[], EngineStats | None]) -> None:
        self._labels = {"model": model_name, "version": MODEL_VERSION}
        self._totals = totals
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        totals, stats = self._totals, self._stats()
        for name, documentation, value in (
                ("nv_inference_request_success", "Successful inference requests",
                 totals.success.count),
                ("nv_inference_request_failure", "Failed inference requests (a client that "
                 "left included)", totals.fail.count),
                ("nv_inference_count", "Inferences performed", totals.success.count),
                ("nv_inference_exec_count", "Model executions (engine steps)",
                 execution_count(stats)),
                ("nv_inference_request_duration_us", "Cumulative request duration, arrival to "
                 "end", (totals.success.ns + totals.fail.ns) // 1000),
                ("nv_inference_queue_duration_us", "Cumulative time successful requests waited "
                 "to be scheduled", totals.queue.ns // 1000),
                ("nv_inference_compute_infer_duration_us", "Cumulative time successful requests "
                 "were computed", totals.compute_infer.ns // 1000)):
            family = Metric(name, documentation, "unknown")
            family.add_sample(name, self._labels, value)
            yield family
        family = Metric("nv_inference_pending_request_count", "Requests waiting to be "
                        "scheduled", "gauge")
        family.add_sample("nv_inference_pending_request_count", self._labels,
                          stats.num_waiting if stats is not None else 0)
        yield family


class ExportedNames(Collector):
    """Another registry's metrics under `switchboard_<name>`, and under vLLM's and MindIE's
    names too."""

    def __init__(self, measures: prometheus_client.CollectorRegistry) -> None:
        self._measures = measures

    def collect(self) -> Iterator[Metric]:
        for family in self._measures.collect():
            for name in (OWN_PREFIX + family.name, *VLLM_NAMES.get(family.name, ()),
                         *MINDIE_NAMES.get(family.name, ())):
                yield _renamed(family, name)


def _renamed(family: Metric, name: str) -> Metric:
    renamed = Metric(name, family.documentation, family.type, family.unit)
    renamed.samples = [sample._replace(name=name + sample.name[len(family.name):])
                       for sample in family.samples]
    return renamed


def _mean(values: collections.deque[float]) -> float:
    return sum(values) / len(values) if values else 0.0
