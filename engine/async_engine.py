"""AsyncEngine: the engine's public, asyncio-facing interface.

The EngineCore runs in one dedicated thread (torch releases the GIL in its kernels); events
reach the event loop in one `loop.call_soon_threadsafe` per step. The thread sleeps on
a condition variable when there is nothing to do: no polling.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import torch
from outlines_core import Guide

from switchboard.engine.block_manager import BlockManager
from switchboard.engine.chat_output import OutputParsers
from switchboard.engine.config import (DEFAULT_KV_TRANSFER_LEASE_S, MAX_SEQUENCES, EngineConfig,
                                      EngineLimits)
from switchboard.engine.core import EngineCore, EngineStats
from switchboard.engine.errors import (EngineDead, EngineError, InvalidRequest, Overloaded,
                                      RequestTimedOut)
from switchboard.engine.fanout import generate_many
from switchboard.engine.guided import GuideBuilder
from switchboard.engine.kv_transfer import KV_TRANSFER_FIELD, KVLayout, PrefilledKV
from switchboard.engine.loader import LoadedModel, load_model
from switchboard.engine.measured_choice import limit_onednn_caches
from switchboard.engine.paged_runner import PagedRunner, kv_bytes_per_token
from switchboard.engine.scheduler import Scheduler
from switchboard.engine.params import GenerationRequest, time_left
from switchboard.engine.quantization import dense_copy_for
from switchboard.engine.request import RequestOutput
from switchboard.engine.timing_store import TimingStore
from switchboard.engine.tokenization import PromptTokenizer, TokenTexts

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the serving layers may tell clients about the loaded model."""

    source: str
    device: str
    dtype: str
    vocab_size: int
    eos_token_ids: frozenset[int]
    num_kv_blocks: int
    block_size: int
    special_token_ids: frozenset[int]
    kv_cache_bytes: int
    max_batch_size: int
    max_waiting_requests: int
    quantization: str = "none"
    output_parsers: OutputParsers = OutputParsers()
    kv_layout: KVLayout | None = None


class _OutputStream:
    """One request's events, put by the event loop as each step's batch arrives and taken by
    its consumer: asyncio.Queue's bookkeeping (size limits, join counts, putters) came to
    most of the loop's time per event at hundreds of streams, and events need none of it.
    streamed: the consumer is woken by each event; else by the last one only, and takes them
    all then (a consumer that answers only at the end spends no wake-up on each token)."""

    __slots__ = ("_events", "_waiter", "_streamed")

    def __init__(self, streamed: bool) -> None:
        self._events: collections.deque[RequestOutput] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._streamed = streamed

    def put(self, output: RequestOutput) -> None:
        self._events.append(output)
        if not (self._streamed or output.is_last):
            return
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> RequestOutput:
        while not self._events:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._events.popleft()


class AsyncEngine:
    def __init__(self, core: EngineCore, tokenizer: object, limits: EngineLimits, info: ModelInfo,
                 max_unfinished: int, num_threads: int = 0,
                 warm_up: Callable[[], None] | None = None, guides: GuideBuilder | None = None,
                 slots_per_request: int = MAX_SEQUENCES,
                 kv_transfer_lease_s: float = DEFAULT_KV_TRANSFER_LEASE_S) -> None:
        """warm_up: run on the engine's thread before its first step (see `wait_ready`);
        guides: for requests with structured output (none may come without);
        slots_per_request: the most sequences of one request that run at once;
        kv_transfer_lease_s: how long a keep_kv request's KV cache waits to be released."""
        self._core = core
        self._guides = guides
        self._slots_per_request = slots_per_request
        self._warm_up = warm_up
        self._tokenizer = tokenizer
        self._token_texts = TokenTexts(tokenizer)
        self.limits = limits
        self.prompts = PromptTokenizer(tokenizer, limits, max_waiting=max_unfinished)
        self.info = info
        self._max_unfinished = max_unfinished
        self._num_threads = num_threads
        # The core knows each request by an internal id unique for the engine's life, so late
        # events of an abandoned request never reach a newer request with the same caller id.
        self._streams: dict[str, _OutputStream] = {}
        self._num_probe_streams = 0  # not counted against max_unfinished
        self._internal_ids: dict[str, str] = {}
        self._counter = itertools.count()
        self._kv_transfer_lease_s = kv_transfer_lease_s
        self._kv_leases: dict[str, asyncio.TimerHandle] = {}
        self._inbox: list[Callable[[EngineCore], None]] = []
        self._wakeup = threading.Condition()
        self._stopping = False
        self._dead = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="engine-core", daemon=True)

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        """Load the model (slow: call it off the event loop, as `load` does) and build an
        engine around it."""
        loaded = load_model(config)
        return cls.from_loaded(loaded, config)

    @classmethod
    async def load(cls, config: EngineConfig) -> AsyncEngine:
        """`from_config` in a thread of its own that exits once the engine is built. A thread
        that has run torch's parallel operations keeps an OpenMP thread team, and a second,
        the engine thread's, on the same cores made each step markedly slower while the loading
        thread lived on, as the default executor's threads do
        (docs/engine-measurements.md#threads)."""
        loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="engine-load")
        try:
            return await asyncio.get_running_loop().run_in_executor(loader, cls.from_config,
                                                                    config)
        finally:
            loader.shutdown(wait=False)

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, config: EngineConfig) -> AsyncEngine:
        limit_onednn_caches()
        # Quantized: copies of the weights for big batches, and a bf16 KV cache with them.
        sample_weight = loaded.model.model.layers[0].mlp.up_proj.weight.detach()
        timings = TimingStore(config.cache_dir)
        dense_copy = (dense_copy_for(sample_weight, timings)
                      if loaded.quantization.is_quantized
                      and not config.enable_deterministic_inference else None)
        kv_dtype = torch.bfloat16 if dense_copy is not None else loaded.dtype
        block_bytes = config.block_size * kv_bytes_per_token(loaded.model, kv_dtype)
        num_blocks = config.num_kv_blocks or max(1, config.kv_cache_mib * 2**20 // block_bytes)
        graphs = loaded.device.type == "cuda" and not config.enforce_eager
        runner = PagedRunner(loaded.model, loaded.device, num_blocks, config.block_size,
                             loaded.quantization, dense_copy=dense_copy, timings=timings,
                             batch_invariant=config.enable_deterministic_inference,
                             static_decode_batch=config.max_batch_size if graphs else 0)
        if graphs:
            runner.prepare()
        speculate = config.num_speculative_tokens
        if speculate and graphs:
            # Verifying steps run eagerly, so against replayed decode steps speculation came out
            # slower even with several tokens a step accepted
            # (docs/engine-measurements.md#cuda-graphs-and-speculation-on-the-h100).
            logger.warning("n-gram speculation is off: decode steps replay CUDA graphs, "
                           "which are faster (--enforce-eager runs every step eagerly)")
            speculate = 0
        block_manager = BlockManager(num_blocks, config.block_size,
                                     enable_prefix_caching=config.enable_prefix_caching)
        scheduler = Scheduler(block_manager, max_running=config.max_batch_size,
                              max_batched_tokens=config.step_token_budget(loaded.device.type),
                              max_prefill_tokens=config.max_prefill_tokens,
                              num_speculative_tokens=speculate,
                              speculative_max_batch=config.speculative_max_batch)
        core = EngineCore(runner, loaded.tokenizer, loaded.eos_token_ids, scheduler)
        guides = GuideBuilder.for_tokenizer(loaded.tokenizer, loaded.tokenizer.eos_token_id,
                                            limits=config.compile_limits(),
                                            cache_bytes=config.guided_cache_bytes())
        limits = EngineLimits.from_config(config, vocab_size=loaded.vocab_size,
                                          max_token_bytes=loaded.max_token_bytes,
                                          max_position_embeddings=loaded.max_position_embeddings,
                                          kv_capacity_tokens=num_blocks * config.block_size)
        info = ModelInfo(source=loaded.source, device=str(loaded.device),
                         dtype=str(loaded.dtype).removeprefix("torch."),
                         vocab_size=loaded.vocab_size, eos_token_ids=loaded.eos_token_ids,
                         num_kv_blocks=num_blocks, block_size=config.block_size,
                         special_token_ids=frozenset(loaded.tokenizer.all_special_ids),
                         kv_cache_bytes=num_blocks * block_bytes,
                         max_batch_size=config.max_batch_size,
                         max_waiting_requests=config.max_queue_len,
                         quantization=loaded.quantization.scheme,
                         output_parsers=OutputParsers(
                             tool_call_parser=config.tool_call_parser,
                             enable_auto_tool_choice=config.enable_auto_tool_choice,
                             reasoning_parser=config.reasoning_parser),
                         kv_layout=runner.kv_layout)
        return cls(core, loaded.tokenizer, limits, info,
                   max_unfinished=config.max_batch_size + config.max_queue_len,
                   num_threads=config.num_threads, warm_up=runner.warm_up, guides=guides,
                   slots_per_request=config.slots_per_request(),
                   kv_transfer_lease_s=config.kv_transfer_lease_s)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread.start()

    async def wait_ready(self) -> None:
        """Return once the engine's thread has warmed the model up and takes requests (they
        may come earlier: they wait); raise EngineDead if the warm-up failed."""
        await self._started.wait()
        if self._dead:
            raise EngineDead("the engine failed to start (see the log)")

    async def shutdown(self) -> None:
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join)
        self.prompts.shutdown()
        self._fail_all()

    @property
    def is_healthy(self) -> bool:
        return self._thread.is_alive() and not self._dead and not self._stopping

    def stats(self) -> EngineStats:
        """Read from any thread: a snapshot of counters the engine thread updates."""
        return self._core.stats()

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        """Each token decoded alone, special tokens included (TGI's and OpenAI's token text)."""
        return self._token_texts(token_ids)

    def generate(self, request: GenerationRequest, prefilled: PrefilledKV | None = None, *,
                 streamed: bool = True) -> AsyncIterator[RequestOutput]:
        """Events for one request, the last one (of each of its n sequences, told apart by
        `index`) with finish_reason set. prefilled: its prompt's KV cache as another engine
        computed it (see `kv_transfer.py`); streamed: False for a caller that answers once
        the request has ended, which then gets each sequence's events together, at its end.

        Raises the request's EngineError (timeout, failure) in place of a last event. Leaving
        the iteration early (cancellation, closing) aborts the request.
        """
        if (prefilled is not None or request.keep_kv) and request.sampling.best_of > 1:
            raise InvalidRequest(KV_TRANSFER_FIELD, "a prefill handed between instances "
                                 "generates one sequence (n and best_of 1)")
        if prefilled is not None:
            prefilled.layout.check_matches(self.info.kv_layout)
            prefilled.check_prompt(request.prompt_token_ids)
        if request.sampling.best_of > 1:
            return generate_many(functools.partial(self._generate_one, streamed=streamed),
                                 request, self._slots_per_request)
        return self._generate_one(request, prefilled=prefilled, streamed=streamed)

    async def _generate_one(self, request: GenerationRequest, admitted: bool = False,
                            prefilled: PrefilledKV | None = None, streamed: bool = True
                            ) -> AsyncIterator[RequestOutput]:
        """admitted: a later sequence of an admitted request (see `fanout.py`), which the
        in-flight limit does not refuse."""
        pattern = request.sampling.pattern
        if pattern is not None and self._guides is None:
            raise InvalidRequest(pattern.field, "structured output is not available")
        if not self.is_healthy:
            raise EngineDead("the engine is not running")
        if request.request_id in self._internal_ids:
            raise InvalidRequest("id", f"request id {request.request_id!r} is already in use")
        if not (request.probe or admitted) \
                and len(self._streams) - self._num_probe_streams >= self._max_unfinished:
            raise Overloaded(f"too many requests in flight ({self._max_unfinished}); retry later")
        internal_id = f"{request.request_id}#{next(self._counter)}"
        stream = _OutputStream(streamed)
        self._streams[internal_id] = stream
        self._num_probe_streams += request.probe
        self._internal_ids[request.request_id] = internal_id
        finished = False
        try:
            guide = None
            if pattern is not None:
                guide, request = await self._guide(request)
            internal_request = dataclasses.replace(request, request_id=internal_id)
            self._submit(lambda core, kv=prefilled: core.add(internal_request, guide, kv))
            prefilled = None  # the engine's cache holds it from now on
            while not finished:
                output = await stream.get()
                finished = output.is_last
                if output.error is not None:
                    raise output.error
                output.request_id = request.request_id
                if output.kv_transfer_id:
                    self._lease(output.kv_transfer_id)
                yield output
        finally:
            del self._streams[internal_id]
            self._num_probe_streams -= request.probe
            del self._internal_ids[request.request_id]
            if not finished:
                self._submit(lambda core: core.abort(internal_id))

    async def _guide(self, request: GenerationRequest) -> tuple[Guide, GenerationRequest]:
        """An admitted request's guide, its pattern compiled within the request's timeout (a
        compile is bounded, its wait for a turn is not), and the request with what is left
        of its timeout."""
        arrival = time.monotonic()
        try:
            async with asyncio.timeout(request.timeout_s):
                guide = await self._guides.guide(request.sampling.pattern)
        except TimeoutError:
            raise RequestTimedOut.after(request.timeout_s) from None
        return guide, time_left(request, arrival)

    async def read_kv(self, transfer_id: str) -> PrefilledKV:
        """The KV cache a finished keep_kv request keeps (NotFound once released)."""
        loop = asyncio.get_running_loop()
        read: asyncio.Future[PrefilledKV] = loop.create_future()

        def settle(kv: PrefilledKV | None, error: EngineError | None) -> None:
            if read.done():  # its caller left
                return
            if error is not None:
                read.set_exception(error)
            else:
                read.set_result(kv)

        def command(core: EngineCore) -> None:
            try:
                outcome = core.read_kv(transfer_id), None
            except EngineError as error:
                outcome = None, error
            loop.call_soon_threadsafe(settle, *outcome)

        self._submit(command)
        return await read

    def release_kv(self, transfer_id: str) -> None:
        """Free the blocks a keep_kv request keeps: its decoding instance has them, or its
        lease ran out."""
        lease = self._kv_leases.pop(transfer_id, None)
        if lease is not None:
            lease.cancel()
            self._submit(lambda core: core.release_kv(transfer_id))

    def _lease(self, transfer_id: str) -> None:
        self._kv_leases[transfer_id] = asyncio.get_running_loop().call_later(
            self._kv_transfer_lease_s, self.release_kv, transfer_id)

    def abort(self, request_id: str) -> None:
        """Abort a request, and the sequences of an n / best_of request: they emit nothing more."""
        self._apply(request_id, EngineCore.abort)

    def stop(self, request_id: str) -> None:
        """End a request early: its stream ends with finish reason STOPPED."""
        self._apply(request_id, EngineCore.stop)

    def _apply(self, request_id: str, command: Callable[[EngineCore, str], None]) -> None:
        for caller_id, internal_id in list(self._internal_ids.items()):
            if caller_id == request_id or caller_id.startswith(f"{request_id}/"):
                self._submit(lambda core, internal_id=internal_id: command(core, internal_id))

    def _submit(self, command: Callable[[EngineCore], None]) -> None:
        with self._wakeup:
            self._inbox.append(command)
            self._wakeup.notify()

    def _run(self) -> None:
        if self._num_threads:
            torch.set_num_threads(self._num_threads)
        try:
            if self._warm_up is not None:
                self._warm_up()
            self._loop.call_soon_threadsafe(self._started.set)
            while True:
                with self._wakeup:
                    while not (self._inbox or self._core.has_work() or self._stopping):
                        self._wakeup.wait()
                    if self._stopping:
                        return
                    inbox, self._inbox = self._inbox, []
                for command in inbox:
                    command(self._core)
                outputs = self._core.step()
                if outputs:
                    self._loop.call_soon_threadsafe(self._deliver, outputs)
        except Exception:
            logger.exception("the engine loop died")
            self._dead = True
            self._loop.call_soon_threadsafe(self._fail_all)
            self._loop.call_soon_threadsafe(self._started.set)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.put(output)

    def _fail_all(self) -> None:
        for request_id, stream in self._streams.items():
            stream.put(RequestOutput(request_id=request_id, new_token_ids=(), text="",
                                           num_prompt_tokens=0, num_generated_tokens=0, seed=0,
                                           error=EngineDead("the engine stopped")))
