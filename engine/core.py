"""EngineCore: the synchronous heart. Each `step()` expires timeouts, admits waiting requests
by priority, runs the model for every running request, samples, and reports what changed.

It is driven by one thread (AsyncEngine) and is testable with a fake ModelRunner.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Collection

from engine.detokenizer import Decoder, IncrementalDetokenizer
from engine.errors import EngineError, GenerationFailed, RequestTimedOut
from engine.model_runner import ModelRunner
from engine.params import GenerationRequest
from engine.request import FinishReason, Request, RequestOutput, RequestStatus
from engine.sampler import make_generator, sample_next_token

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, runner: ModelRunner, tokenizer: Decoder, eos_token_ids: Collection[int],
                 max_running: int) -> None:
        self._runner = runner
        self._tokenizer = tokenizer
        self._eos_token_ids = frozenset(eos_token_ids)
        self._max_running = max_running
        self._waiting: list[tuple[tuple[int, int], Request]] = []
        self._running: list[Request] = []
        self._requests: dict[str, Request] = {}
        self._arrivals = itertools.count()

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def has_work(self) -> bool:
        return bool(self._requests)

    def add(self, spec: GenerationRequest) -> None:
        request = Request(
            spec=spec,
            arrival_index=next(self._arrivals),
            detokenizer=IncrementalDetokenizer(self._tokenizer, spec.prompt_token_ids),
            generator=make_generator(spec.sampling.seed),
        )
        self._requests[spec.request_id] = request
        heapq.heappush(self._waiting, (request.sort_key, request))

    def abort(self, request_id: str) -> None:
        """Drop a request whose consumer is gone; it emits nothing more."""
        request = self._requests.get(request_id)
        if request is not None:
            self._finish(request, RequestStatus.FINISHED_ABORTED)
            logger.info("request %s aborted", request_id)

    def step(self) -> list[RequestOutput]:
        outputs = self._expire(time.monotonic())
        self._admit()
        for request in list(self._running):
            outputs.append(self._run_one(request))
        return outputs

    def _expire(self, now: float) -> list[RequestOutput]:
        expired = [r for r in self._requests.values() if now >= r.deadline]
        for request in expired:
            self._finish(request, RequestStatus.FINISHED_TIMED_OUT)
            logger.info("request %s timed out after %ss", request.request_id, request.spec.timeout_s)
        return [self._error_output(r, RequestTimedOut(
            f"request timed out after {r.spec.timeout_s:g} s")) for r in expired]

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self._max_running:
            _, request = heapq.heappop(self._waiting)
            request.status = RequestStatus.RUNNING
            self._running.append(request)

    def _run_one(self, request: Request) -> RequestOutput:
        try:
            if request.model_state is None:
                logits, request.model_state = self._runner.prefill(request.spec.prompt_token_ids)
            else:
                logits = self._runner.decode(request.output_token_ids[-1], request.model_state)
            token_id = sample_next_token(logits, request.spec.sampling, request.seen_token_ids(),
                                         request.generator)
        except Exception:
            logger.exception("request %s failed in the model step", request.request_id)
            self._finish(request, RequestStatus.FINISHED_FAILED)
            return self._error_output(request, GenerationFailed("generation failed in the model step"))
        return self._append_token(request, token_id)

    def _append_token(self, request: Request, token_id: int) -> RequestOutput:
        request.output_token_ids.append(token_id)
        sampling = request.spec.sampling
        finish: FinishReason | None = None
        if token_id in self._eos_token_ids:
            finish = FinishReason.EOS
        else:
            finish = self._append_text(request, request.detokenizer.add(token_id))
        if finish is None and len(request.output_token_ids) >= sampling.max_new_tokens:
            finish = FinishReason.LENGTH
        if finish is not None and finish is not FinishReason.STOP:
            finish = self._append_text(request, request.detokenizer.flush()) or finish
        held_back = 0 if finish is not None else max(map(len, sampling.stop), default=1) - 1
        emit_to = max(request.num_emitted_chars, len(request.text) - held_back)
        delta = request.text[request.num_emitted_chars:emit_to]
        request.num_emitted_chars = emit_to
        if finish is not None:
            request.finish_reason = finish
            self._finish(request, RequestStatus.FINISHED_STOPPED)
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=(token_id,),
            text=delta,
            num_prompt_tokens=len(request.spec.prompt_token_ids),
            num_generated_tokens=len(request.output_token_ids),
            seed=sampling.seed,
            finish_reason=finish,
        )

    @staticmethod
    def _append_text(request: Request, text: str) -> FinishReason | None:
        """Add decoded text; cut it at the first stop string, if one is now complete."""
        stops = request.spec.sampling.stop
        search_from = max(0, len(request.text) - max(map(len, stops), default=0) + 1)
        request.text += text
        if not text or not stops:
            return None
        hits = [i for i in (request.text.find(stop, search_from) for stop in stops) if i >= 0]
        if not hits:
            return None
        request.text = request.text[:min(hits)]
        return FinishReason.STOP

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        request.model_state = None
        self._requests.pop(request.request_id, None)
        if request in self._running:
            self._running.remove(request)
        else:
            self._waiting = [(key, r) for key, r in self._waiting if r is not request]
            heapq.heapify(self._waiting)

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
