"""Decides, each step, which requests compute how many tokens.

Scheduling is by token counts, not by phase: each running request asks for the tokens it
has not computed yet (a whole prompt, the rest of a prompt, or one token when decoding).
Every decoding request gets its token each step; prompt tokens (of running prefills, then
of waiting requests, highest priority first) share a per-step budget, so chunked prefill
falls out of the arithmetic, a long prompt never stalls decoding streams, and decoding
streams never keep new requests from starting. While no request decodes, the budget stretches
to the first prompt in line, up to max_prefill_tokens: there is no stream to keep flowing,
and every chunk reads all the weights again, so one step is quicker than chunks
(docs/engine-measurements.md#scheduling-and-chunked-prefill).
With n-gram speculation on, a decoding request of a small enough batch also computes the
tokens `propose_ngram` guesses will follow its newest one, for the engine to verify.
When the KV pool runs out, the lowest-priority, latest request is preempted: its blocks
are freed and it waits to be recomputed.
"""

from __future__ import annotations

import heapq
import operator
import time
from dataclasses import dataclass

from switchboard.engine.block_manager import BlockManager
from switchboard.engine.request import Request, RequestStatus
from switchboard.engine.speculation import propose_ngram


@dataclass(slots=True)
class ScheduledChunk:
    """Compute tokens [start, start + num_tokens) of a request's prompt-and-output tokens,
    the last len(draft_token_ids) of them guessed ones that follow its newest token."""

    request: Request
    start: int
    num_tokens: int
    draft_token_ids: tuple[int, ...] = ()

    @property
    def samples(self) -> bool:
        """The chunk reaches the request's last token, so its logits give the next one."""
        return self.start + self.num_tokens - len(self.draft_token_ids) == self.request.num_tokens

    @property
    def all_logits(self) -> bool:
        """The chunk reaches prompt positions whose next token's log-probability is still to
        be recorded, so the logits at each of its tokens are wanted."""
        request = self.request
        return (request.needs_prompt_logprobs
                and self.start + self.num_tokens > len(request.prompt_logprobs))


_SORT_KEY = operator.attrgetter("sort_key")


def _is_decoding(request: Request) -> bool:
    """Only its newest token is uncomputed (a prompt's last token is still prefill)."""
    return bool(request.output_token_ids) and request.num_uncomputed_tokens == 1


class Scheduler:
    def __init__(self, block_manager: BlockManager, *, max_running: int, max_batched_tokens: int,
                 max_prefill_tokens: int, num_speculative_tokens: int = 0,
                 speculative_max_batch: int = 0) -> None:
        """num_speculative_tokens: guesses verified per decoding request and step, in steps
        of at most speculative_max_batch decoding requests (0: no speculation)."""
        self.block_manager = block_manager
        self.max_running = max_running
        self._max_batched_tokens = max_batched_tokens
        self._max_prefill_tokens = max_prefill_tokens
        self._num_speculative_tokens = num_speculative_tokens
        self._speculative_max_batch = speculative_max_batch
        self._waiting: list[tuple[tuple[int, int], Request]] = []
        self.running: list[Request] = []
        self.num_preemptions = 0

    @property
    def num_speculative_tokens(self) -> int:
        """The most tokens guessed for a request in one step (0: no speculation)."""
        return self._num_speculative_tokens

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def waiting(self) -> list[Request]:
        return [request for _, request in self._waiting]

    def add(self, request: Request) -> None:
        heapq.heappush(self._waiting, (request.sort_key, request))

    def remove(self, request: Request) -> None:
        """Take a finished, aborted or timed-out request out, freeing its blocks."""
        self.block_manager.free(request.block_table)
        if request in self.running:
            self.running.remove(request)
        else:
            self._waiting = [(key, r) for key, r in self._waiting if r is not request]
            heapq.heapify(self._waiting)

    def schedule(self) -> list[ScheduledChunk]:
        chunks: dict[Request, ScheduledChunk] = {}
        preempted = False
        decoding: list[Request] = []
        prefilling: list[Request] = []
        for request in sorted(self.running, key=_SORT_KEY):
            (decoding if _is_decoding(request) else prefilling).append(request)
        in_line = prefilling or [request for _, request in self._waiting[:1]]
        budget = self._prefill_budget(decoding=bool(decoding),
                                      first_in_line=in_line[0] if in_line else None)
        for position, request in enumerate(decoding + prefilling):
            if request.status is not RequestStatus.RUNNING:
                continue
            is_prefill = position >= len(decoding)
            num_tokens = min(request.num_uncomputed_tokens, budget) if is_prefill else 1
            if num_tokens <= 0:
                continue
            while not self.block_manager.allocate(request.block_table,
                                                  request.num_computed_tokens + num_tokens):
                victim = max(self.running, key=_SORT_KEY)
                self._preempt(victim)
                preempted = True
                if victim in chunks:
                    budget += self._prefill_tokens(chunks.pop(victim))
                if victim is request:
                    break
            if request.status is RequestStatus.RUNNING:
                chunks[request] = ScheduledChunk(request, request.num_computed_tokens, num_tokens)
                budget -= num_tokens if is_prefill else 0
        if not preempted:
            self._admit(chunks, budget)
            self._speculate(chunks)
        return list(chunks.values())

    def _prefill_budget(self, decoding: bool, first_in_line: Request | None) -> int:
        """Prompt tokens this step may compute (see the module's docstring). A prompt whose
        log-probabilities are asked for keeps to the step budget: a row of logits over the
        vocabulary is kept for each of its tokens (200 KB each with SmolLM2's 49,152)."""
        budget = min(self._max_batched_tokens, self._max_prefill_tokens)
        if decoding or first_in_line is None or first_in_line.needs_prompt_logprobs:
            return budget
        return min(self._max_prefill_tokens, max(budget, first_in_line.num_uncomputed_tokens))

    def _admit(self, chunks: dict[Request, ScheduledChunk], budget: int) -> None:
        """Start waiting requests, best priority first, while budget, slots and blocks last
        (a probe needs no free slot, and takes none from the others).
        A request still collecting prompt log-probabilities reuses no cached prefix: it must
        compute every prompt position."""
        num_running = sum(not running.spec.probe for running in self.running)
        while self._waiting and budget > 0:
            request = self._waiting[0][1]
            if num_running >= self.max_running and not request.spec.probe:
                return
            if not request.block_table.block_ids and not request.needs_prompt_logprobs:
                request.num_computed_tokens = self.block_manager.reuse_prefix(
                    request.block_table, request.all_token_ids)
            num_tokens = self._chunk_size(request, budget)
            if num_tokens == 0 or not self.block_manager.allocate(
                    request.block_table, request.num_computed_tokens + num_tokens):
                self.block_manager.free(request.block_table)
                request.num_computed_tokens = 0
                return
            heapq.heappop(self._waiting)
            request.status = RequestStatus.RUNNING
            if request.first_scheduled_time is None:
                request.first_scheduled_time = time.monotonic()
                request.num_cached_tokens = min(request.num_computed_tokens,
                                                len(request.spec.prompt_token_ids))
            self.running.append(request)
            num_running += not request.spec.probe
            chunks[request] = ScheduledChunk(request, request.num_computed_tokens, num_tokens)
            budget -= self._prefill_tokens(chunks[request])

    def _speculate(self, chunks: dict[Request, ScheduledChunk]) -> None:
        """Add guessed tokens to the decoding requests' chunks, as many as each one's draft
        window allows and it may still generate after its next token, where the pool has room
        for them (they never preempt)."""
        if not self._num_speculative_tokens:
            return
        decoding = [chunk for chunk in chunks.values() if _is_decoding(chunk.request)]
        if len(decoding) > self._speculative_max_batch:
            return
        for chunk in decoding:
            request = chunk.request
            room = request.spec.sampling.max_new_tokens - len(request.output_token_ids) - 1
            size = request.draft_window.next_size(min(self._num_speculative_tokens, room))
            drafts = propose_ngram(request.all_token_ids, size)
            if drafts and self.block_manager.allocate(request.block_table,
                                                      request.num_tokens + len(drafts)):
                chunks[request] = ScheduledChunk(request, chunk.start,
                                                 chunk.num_tokens + len(drafts), drafts)

    @staticmethod
    def _chunk_size(request: Request, prefill_budget: int) -> int:
        if _is_decoding(request):
            return 1
        return max(0, min(request.num_uncomputed_tokens, prefill_budget))

    @staticmethod
    def _prefill_tokens(chunk: ScheduledChunk) -> int:
        return 0 if _is_decoding(chunk.request) else chunk.num_tokens

    def _preempt(self, request: Request) -> None:
        self.block_manager.free(request.block_table)
        self.running.remove(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self.num_preemptions += 1
        heapq.heappush(self._waiting, (request.sort_key, request))
