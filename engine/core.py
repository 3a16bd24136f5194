"""EngineCore: the synchronous heart. Each `step()` reads: expire timeouts; schedule; run the
model on the scheduled chunks; sample; update requests and emit events.

It is driven by one thread (AsyncEngine) and is testable with a fake model runner.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from outlines_core import Guide

from switchboard.engine.detokenizer import Decoder, IncrementalDetokenizer, direct_decoder
from switchboard.engine.block_manager import BlockTable
from switchboard.engine.errors import EngineError, GenerationFailed, NotFound, RequestTimedOut
from switchboard.engine.kv_transfer import KVLayout, PrefilledKV
from switchboard.engine.params import GenerationRequest
from switchboard.engine.paged_runner import SequenceChunk
from switchboard.engine.request import (FinishReason, Request, RequestOutput, RequestStatus, RequestTimings,
                            TokenLogprob)
from switchboard.engine.sampler import make_generator, sample_batch
from switchboard.engine.scheduler import ScheduledChunk, Scheduler
from switchboard.engine.tool_parsers import held_prefix_length

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's load and KV cache (MindIE's slot and block counts);
    num_steps: the steps that ran the model so far (Triton's execution count); speculation
    so far (vLLM's counters): requests' steps that verified guesses, the guesses verified, and
    those accepted, in all and by their position in the guess (0: the first guessed token; a
    guess is accepted only after the ones before it)."""

    num_free_blocks: int
    num_total_blocks: int
    num_waiting: int
    num_running: int
    num_preemptions: int
    block_size: int
    max_batch_size: int
    num_steps: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_position: tuple[int, ...] = ()

    @property
    def free_slots(self) -> int:
        """Requests that would run at once, without waiting for a place in the batch."""
        return max(0, self.max_batch_size - self.num_running - self.num_waiting)


class ModelRunner(Protocol):
    def execute(self, chunks: Sequence[SequenceChunk]) -> torch.Tensor:
        """Logits [rows, vocab], float32 on the model's device, rows in chunk order: each
        chunk's last `num_logits` tokens (with all_logits, its last is also the sampling row
        when the chunk samples)."""

    @property
    def kv_layout(self) -> KVLayout: ...

    def read_kv(self, block_ids: Sequence[int], num_tokens: int
                ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def write_kv(self, block_ids: Sequence[int], start: int, keys: torch.Tensor,
                 values: torch.Tensor) -> None: ...


class EngineCore:
    def __init__(self, runner: ModelRunner, tokenizer: Decoder, eos_token_ids: Collection[int],
                 scheduler: Scheduler) -> None:
        self._runner = runner
        self._decoder = direct_decoder(tokenizer)
        self._eos_token_ids = frozenset(eos_token_ids)
        self.scheduler = scheduler
        self._requests: dict[str, Request] = {}
        # Finished keep_kv requests' blocks, and the tokens whose KV they hold, by transfer id.
        self._kept: dict[str, tuple[BlockTable, tuple[int, ...]]] = {}
        self._arrivals = itertools.count()
        self._stopped: list[RequestOutput] = []
        self._num_steps = 0
        self._num_drafts = self._num_draft_tokens = self._num_accepted_tokens = 0
        self._accepted_by_position = [0] * scheduler.num_speculative_tokens

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    def stats(self) -> EngineStats:
        block_manager = self.scheduler.block_manager
        return EngineStats(num_free_blocks=block_manager.num_free_blocks,
                           num_total_blocks=block_manager.num_blocks,
                           num_waiting=self.num_waiting, num_running=self.num_running,
                           num_preemptions=self.scheduler.num_preemptions,
                           block_size=block_manager.block_size,
                           max_batch_size=self.scheduler.max_running,
                           num_steps=self._num_steps, num_drafts=self._num_drafts,
                           num_draft_tokens=self._num_draft_tokens,
                           num_accepted_tokens=self._num_accepted_tokens,
                           num_accepted_tokens_per_position=tuple(self._accepted_by_position))

    def has_work(self) -> bool:
        return bool(self._requests)

    def add(self, spec: GenerationRequest, guide: Guide | None = None,
            prefilled: PrefilledKV | None = None) -> None:
        """guide: the request's structured output, for one with a pattern (see `guided.py`);
        prefilled: its prompt's KV cache as another engine computed it, checked against the
        prompt (see `kv_transfer.py`)."""
        request = Request(
            spec=spec,
            arrival_index=next(self._arrivals),
            detokenizer=IncrementalDetokenizer(self._decoder, spec.prompt_token_ids,
                                               spec.sampling.skip_special_tokens),
            generator=make_generator(spec.sampling.seed),
            guide=guide,
        )
        self._requests[spec.request_id] = request
        if prefilled is not None:
            self._import(request, prefilled)
        self.scheduler.add(request)

    def _import(self, request: Request, prefilled: PrefilledKV) -> None:
        """Give the request blocks holding the prefilled tokens' KV, after any prefix this
        cache already holds; the rest of its prompt (at least its last token) is computed as
        usual. Where the pool is short it computes the whole prompt instead."""
        if request.needs_prompt_logprobs:  # every prompt position's logits are computed here
            return
        block_manager = self.scheduler.block_manager
        table = request.block_table
        num_tokens = len(prefilled.token_ids)
        reused = block_manager.reuse_prefix(table, request.all_token_ids)
        if not block_manager.allocate(table, num_tokens):
            block_manager.free(table)
            logger.warning("request %s: no room for its %d prefilled tokens; it computes them",
                           request.request_id, num_tokens)
            return
        if num_tokens > reused:
            self._runner.write_kv(table.block_ids, reused, prefilled.keys[:, reused:],
                                  prefilled.values[:, reused:])
        self._computed(request, max(reused, num_tokens))

    def read_kv(self, transfer_id: str) -> PrefilledKV:
        """The KV cache a finished keep_kv request left (its prompt's, but for the last token,
        which the decoding engine computes)."""
        table, token_ids = self._kept_blocks(transfer_id)
        keys, values = self._runner.read_kv(table.block_ids, len(token_ids))
        return PrefilledKV(self._runner.kv_layout, token_ids, keys, values)

    def release_kv(self, transfer_id: str) -> None:
        kept = self._kept.pop(transfer_id, None)
        if kept is not None:
            self.scheduler.block_manager.free(kept[0])

    def _kept_blocks(self, transfer_id: str) -> tuple[BlockTable, tuple[int, ...]]:
        try:
            return self._kept[transfer_id]
        except KeyError:
            raise NotFound(f"no KV cache is kept under {transfer_id!r} (released, or its "
                           f"lease ran out)") from None

    def abort(self, request_id: str) -> None:
        """Drop a request whose consumer is gone; it emits nothing more."""
        request = self._requests.get(request_id)
        if request is not None:
            self._finish(request, RequestStatus.FINISHED_ABORTED)
            logger.info("request %s aborted", request_id)

    def stop(self, request_id: str) -> None:
        """End a request early on its client's behalf; its last event (finish reason STOPPED,
        with any text still held back) comes out of the next step."""
        request = self._requests.get(request_id)
        if request is None:
            return
        held = request.detokenizer.flush()
        self._append_text(request, held, check_stops=True)
        request.finish_reason = FinishReason.STOPPED
        self._finish(request, RequestStatus.FINISHED_STOPPED)
        self._stopped.append(self._output(request, (), None, FinishReason.STOPPED, None, held))
        logger.info("request %s stopped on request", request_id)

    def step(self) -> list[RequestOutput]:
        outputs, self._stopped = self._stopped, []
        outputs.extend(self._expire(time.monotonic()))
        chunks = self.scheduler.schedule()
        if not chunks:
            return outputs
        self._num_steps += 1
        chunks, logits, outputs_of_failed = self._execute(chunks)
        outputs.extend(outputs_of_failed)
        for chunk in chunks:
            if not chunk.draft_token_ids:  # a speculative chunk's count waits for its verdict
                self._computed(chunk.request, chunk.num_tokens)
        logits = self._take_prompt_logprobs(chunks, logits)
        # The runner's logits are inference tensors; penalties edit them in place.
        with torch.inference_mode():
            outputs.extend(self._sample([chunk for chunk in chunks if chunk.samples], logits,
                                        len(chunks)))
        return outputs

    def _sample(self, chunks: Sequence[ScheduledChunk], logits: torch.Tensor,
                batch_size: int) -> list[RequestOutput]:
        """Each sampling chunk's next token, from its first row of `logits` (each chunk's rows
        follow each other, in chunk order). A speculative chunk goes on: while the token just
        sampled equals its next guess, the row after gives the token after that guess. So
        every token is sampled as decoding one at a time would sample it (penalties, masks and
        the seeded generator see the tokens before it), and a request keeps exactly the
        output it would have had without speculation."""
        outputs: list[RequestOutput] = []
        firsts = list(itertools.accumulate((1 + len(c.draft_token_ids) for c in chunks),
                                           initial=0))
        verified = [0] * len(chunks)  # guesses accepted so far, by chunk
        pending = list(range(len(chunks)))
        while pending:
            requests = [chunks[i].request for i in pending]
            rows = logits if len(pending) == len(logits) else \
                logits[[firsts[i] + verified[i] for i in pending]]
            try:
                sampled = sample_batch(rows, requests, self._eos_token_ids)
            except Exception:
                logger.exception("sampling failed for requests %s",
                                 ", ".join(request.request_id for request in requests))
                return outputs + [self._fail(request) for request in requests]
            step_time = time.monotonic()
            still_pending: list[int] = []
            for i, (token_id, logprob) in zip(pending, sampled):
                chunk, request = chunks[i], chunks[i].request
                outputs.append(self._append_token(request, token_id, logprob, step_time,
                                                  batch_size))
                drafts = chunk.draft_token_ids
                if not drafts:
                    continue
                finished = request.status >= RequestStatus.FINISHED_STOPPED
                if not finished and verified[i] < len(drafts) and token_id == drafts[verified[i]]:
                    verified[i] += 1
                    still_pending.append(i)
                    continue
                self._num_drafts += 1
                self._num_draft_tokens += len(drafts)
                self._num_accepted_tokens += verified[i]
                for position in range(verified[i]):
                    self._accepted_by_position[position] += 1
                if not finished:
                    request.draft_window.record(verified[i])
                    self._computed(request, chunk.num_tokens - len(drafts) + verified[i])
            pending = still_pending
        return outputs

    def _computed(self, request: Request, num_tokens: int) -> None:
        """Count num_tokens more of the request's tokens as held by the KV cache, and offer
        the blocks they filled to the prefix cache."""
        request.num_computed_tokens += num_tokens
        block_manager = self.scheduler.block_manager
        if block_manager.fills(request.block_table, request.num_computed_tokens):
            block_manager.commit(request.block_table, request.all_token_ids,
                                 request.num_computed_tokens)

    def _execute(self, chunks: list[ScheduledChunk]
                 ) -> tuple[list[ScheduledChunk], torch.Tensor, list[RequestOutput]]:
        """Run the model; if the batch fails, run its chunks one by one so that only the
        requests that fail alone are failed (K/V writes to a slot are idempotent)."""
        try:
            return chunks, self._runner.execute([self._sequence_chunk(c) for c in chunks]), []
        except Exception:
            if len(chunks) == 1:
                logger.exception("request %s failed in the model step", chunks[0].request.request_id)
                return [], torch.empty(0), [self._fail(chunks[0].request)]
            logger.exception("a model step of %d requests failed; retrying them one by one",
                             len(chunks))
        survivors: list[ScheduledChunk] = []
        rows: list[torch.Tensor] = []
        failed: list[RequestOutput] = []
        for chunk in chunks:
            survived, logits, failure = self._execute([chunk])
            survivors.extend(survived)
            failed.extend(failure)
            if survived and (chunk.samples or chunk.all_logits):
                rows.append(logits)
        return survivors, torch.cat(rows) if rows else torch.empty(0), failed

    @staticmethod
    def _sequence_chunk(chunk: ScheduledChunk) -> SequenceChunk:
        request = chunk.request
        drafts = chunk.draft_token_ids
        end = chunk.start + chunk.num_tokens - len(drafts)
        return SequenceChunk(request_id=request.request_id,
                             token_ids=[*request.token_ids(chunk.start, end), *drafts],
                             start=chunk.start, block_ids=request.block_table.block_ids,
                             samples=chunk.samples, all_logits=chunk.all_logits,
                             num_draft_tokens=len(drafts))

    def _take_prompt_logprobs(self, chunks: Sequence[ScheduledChunk], logits: torch.Tensor
                              ) -> torch.Tensor:
        """Record the prompt log-probabilities in the rows of all-logits chunks; return the
        sampler's rows: those of each sampling chunk (its last, and those that verify its
        guesses), in order."""
        all_logits = [chunk.all_logits for chunk in chunks]  # before recording changes them
        if not any(all_logits):
            return logits
        sample_rows: list[int] = []
        end = 0
        for chunk, wanted in zip(chunks, all_logits):
            if wanted:
                self._record_prompt_logprobs(chunk, logits[end:end + chunk.num_tokens])
                end += chunk.num_tokens
            elif chunk.samples:
                end += 1 + len(chunk.draft_token_ids)
            if chunk.samples:
                sample_rows.extend(range(end - 1 - len(chunk.draft_token_ids), end))
        return logits[sample_rows]

    @staticmethod
    def _record_prompt_logprobs(chunk: ScheduledChunk, rows: torch.Tensor) -> None:
        """rows[i]: the logits after position chunk.start + i, which give the log-probability
        of the prompt token after it, and the request's number of top alternatives there
        (vLLM's prompt_logprobs with echo: lm-evaluation-harness tells whether a text is the
        greedy one by them). Positions recorded before (a preempted request recomputes them)
        are skipped."""
        request = chunk.request
        prompt = request.spec.prompt_token_ids
        first = len(request.prompt_logprobs)
        end = min(chunk.start + chunk.num_tokens, len(prompt) - 1)
        if end <= first:
            return
        targets = prompt[first + 1:end + 1]
        logprobs = torch.log_softmax(rows[first - chunk.start:end - chunk.start].cpu(), dim=-1)
        chosen = logprobs.gather(1, torch.tensor(targets).unsqueeze(1)).squeeze(1).tolist()
        num_top = request.spec.sampling.logprobs or 0
        if num_top:
            top = logprobs.topk(num_top, dim=-1)
            alternatives = [tuple(zip(ids, values)) for ids, values
                            in zip(top.indices.tolist(), top.values.tolist())]
        else:
            alternatives = [()] * len(targets)
        request.prompt_logprobs.extend(map(TokenLogprob, targets, chosen, alternatives))

    def _expire(self, now: float) -> list[RequestOutput]:
        expired = [r for r in self._requests.values() if now >= r.deadline]
        for request in expired:
            self._finish(request, RequestStatus.FINISHED_TIMED_OUT)
            logger.info("request %s timed out after %ss", request.request_id, request.spec.timeout_s)
        return [self._error_output(r, RequestTimedOut.after(r.spec.timeout_s)) for r in expired]

    def _fail(self, request: Request) -> RequestOutput:
        self._finish(request, RequestStatus.FINISHED_FAILED)
        return self._error_output(request, GenerationFailed("generation failed in the model step"))

    def _append_token(self, request: Request, token_id: int, logprob: TokenLogprob | None,
                      step_time: float, batch_size: int) -> RequestOutput:
        sampling = request.spec.sampling
        request.output_token_ids.append(token_id)
        if request.guide is not None and token_id not in self._eos_token_ids:
            request.guide.advance(token_id)  # a match, complete or not, may go on
        token_latency = step_time - (request.last_token_time or request.arrival_time)
        if request.first_token_time is None:
            request.first_token_time = step_time
        request.last_token_time = step_time
        num_generated = len(request.output_token_ids)
        finish: FinishReason | None = None
        decoded = ""
        if token_id in self._eos_token_ids and not sampling.ignore_eos:
            finish = FinishReason.EOS
        elif token_id in sampling.stop_token_ids:
            finish = FinishReason.STOP
        else:
            decoded = request.detokenizer.add(token_id)
            finish = self._append_text(request, decoded,
                                       check_stops=num_generated > sampling.min_new_tokens)
        if finish is None and num_generated >= sampling.max_new_tokens:
            finish = FinishReason.LENGTH
        if finish is not None and finish is not FinishReason.STOP:
            held = request.detokenizer.flush()
            decoded += held
            finish = self._append_text(request, held, check_stops=True) or finish
        if finish is not None:
            request.finish_reason = finish
            self._finish(request, RequestStatus.FINISHED_STOPPED)
        timings = RequestTimings(
            queue_wait=(request.first_scheduled_time or step_time) - request.arrival_time,
            first_token=request.first_token_time - request.arrival_time,
            step_time=step_time,
            token_latency=token_latency,
            batch_size=batch_size,
        )
        return self._output(request, (token_id,), logprob, finish, timings, decoded)

    def _output(self, request: Request, new_token_ids: tuple[int, ...],
                logprob: TokenLogprob | None, finish: FinishReason | None,
                timings: RequestTimings | None, decoded: str) -> RequestOutput:
        """The event for what a request produced: text is emitted up to the held-back tail
        that could still grow into a stop string, all of it once finished (and at once with
        include_stop_str_in_output, whose stop string is part of the text)."""
        sampling = request.spec.sampling
        first_token = bool(new_token_ids) and len(request.output_token_ids) == 1
        prompt_logprobs = (None, *request.prompt_logprobs) \
            if sampling.prompt_logprobs and first_token else ()
        held_back = 0 if finish is not None or sampling.include_stop_str_in_output \
            else held_prefix_length(request.text, sampling.stop)
        emit_to = max(request.num_emitted_chars, len(request.text) - held_back)
        delta = request.text[request.num_emitted_chars:emit_to]
        request.num_emitted_chars = emit_to
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=new_token_ids,
            text=delta,
            num_prompt_tokens=len(request.spec.prompt_token_ids),
            num_generated_tokens=len(request.output_token_ids),
            seed=sampling.seed,
            finish_reason=finish,
            logprobs=(logprob,) if logprob is not None else (),
            num_cached_tokens=request.num_cached_tokens,
            timings=timings,
            prompt_logprobs=prompt_logprobs,
            decoded_text=decoded,
            kv_transfer_id=request.request_id if request.request_id in self._kept else "",
        )

    @staticmethod
    def _append_text(request: Request, text: str, *, check_stops: bool) -> FinishReason | None:
        """Add decoded text; cut it at the first stop string, if one is now complete (after it,
        with include_stop_str_in_output)."""
        sampling = request.spec.sampling
        if not text or not sampling.stop or not check_stops:
            request.text += text
            return None
        search_from = max(0, len(request.text) - max(map(len, sampling.stop)) + 1)
        request.text += text
        hits = [(found, stop) for found, stop in
                ((request.text.find(stop, search_from), stop) for stop in sampling.stop)
                if found >= 0]
        if not hits:
            return None
        found, stop = min(hits)
        request.text = request.text[:found + (len(stop) if sampling.include_stop_str_in_output
                                              else 0)]
        return FinishReason.STOP

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        self._requests.pop(request.request_id, None)
        prompt = request.spec.prompt_token_ids
        if request.spec.keep_kv and status is RequestStatus.FINISHED_STOPPED \
                and request.num_computed_tokens >= len(prompt) - 1:
            self._kept[request.request_id] = (request.block_table, prompt[:len(prompt) - 1])
            request.block_table = BlockTable()
        self.scheduler.remove(request)

    @staticmethod
    def _error_output(request: Request, error: EngineError) -> RequestOutput:
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=(),
            text="",
            num_prompt_tokens=len(request.spec.prompt_token_ids),
            num_generated_tokens=len(request.output_token_ids),
            seed=request.spec.sampling.seed,
            error=error,
        )
