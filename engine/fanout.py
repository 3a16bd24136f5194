"""n and best_of: several sequences for one request, run as independent child requests.

Child i samples with seed + i, modulo 2^64 (child 0 with the request's own seed, so n = 1 is
the plain request). With best_of > n every child is generated to the end, and the n with the
highest cumulative log-probability are returned, ranked, as TGI and vLLM do; with best_of == n
the children's events stream as they come, each carrying its `index`.

The prompt's log-probabilities, when asked for, are computed by child 0 alone and come on the
request's first event: with best_of == n the other children's events wait for child 0's first
(a cached prompt can let them start a step or more before it); ranked, they move to the best
sequence's first event, child 0 being ranked or not.

At most `max_running` children run at once (maxSlotsPerRequest): the next starts as one ends,
with what is left of the request's timeout, so that one request's sequences never hold every
slot of the batch while other requests wait. vLLM schedules all of a request's sequences
as they come, TGI refuses a best_of over its --max-best-of; here a request up to maxBestOf is
served in full, its sequences past its share of the slots taking their turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable

from switchboard.engine.params import GenerationRequest, time_left
from switchboard.engine.request import RequestOutput
from switchboard.engine.validation import UINT64_MAX

# (child, admitted): a child started after the first `max_running` belongs to a request
# already admitted, and takes its turn whatever has come since.
GenerateOne = Callable[[GenerationRequest, bool], AsyncIterator[RequestOutput]]


async def generate_many(generate_one: GenerateOne, request: GenerationRequest,
                        max_running: int) -> AsyncIterator[RequestOutput]:
    sampling = request.sampling
    ranked = sampling.best_of > sampling.n
    children = [_child(request, index, ranked) for index in range(sampling.best_of)]
    inbox: asyncio.Queue[tuple[int, RequestOutput | Exception | None]] = asyncio.Queue()
    arrival = time.monotonic()

    async def pump(index: int, child: GenerationRequest) -> None:
        try:
            async with contextlib.aclosing(generate_one(child, index >= max_running)) as events:
                async for event in events:
                    inbox.put_nowait((index, event))
        except Exception as error:
            inbox.put_nowait((index, error))
        else:
            inbox.put_nowait((index, None))

    tasks: list[asyncio.Task[None]] = []

    def start_next() -> None:
        if len(tasks) < len(children):
            child = time_left(children[len(tasks)], arrival)
            tasks.append(asyncio.create_task(pump(len(tasks), child)))

    kept: dict[int, list[RequestOutput]] = defaultdict(list)
    # Events waiting for child 0's first or its end (None: none wait).
    held: list[tuple[int, RequestOutput]] | None = \
        [] if sampling.prompt_logprobs and not ranked else None
    try:
        for _ in range(max_running):
            start_next()
        remaining = len(children)
        while remaining:
            index, item = await inbox.get()
            if isinstance(item, Exception):
                raise item
            if item is None:
                remaining -= 1
                start_next()
            elif ranked:
                kept[index].append(item)
            elif held is not None and index != 0:
                held.append((index, item))
            else:
                yield _relabel(item, request, index)
            if index == 0 and held is not None:
                for waiting_index, waiting in held:
                    yield _relabel(waiting, request, waiting_index)
                held = None
        best = sorted(kept, key=lambda index: -_cumulative_logprob(kept[index]))[:sampling.n]
        prompt_logprobs = kept[0][0].prompt_logprobs if kept[0] else ()
        for position, (rank, event) in enumerate(
                (rank, event) for rank, index in enumerate(best) for event in kept[index]):
            event = dataclasses.replace(event, prompt_logprobs=() if position else prompt_logprobs)
            yield _relabel(event, request, rank)
    finally:
        for task in tasks:
            task.cancel()


def _child(request: GenerationRequest, index: int, ranked: bool) -> GenerationRequest:
    sampling = request.sampling
    return dataclasses.replace(
        request,
        request_id=f"{request.request_id}/{index}",
        sampling=dataclasses.replace(
            sampling, n=1, best_of=1, seed=(sampling.seed + index) % (UINT64_MAX + 1),
            # Ranking needs each chosen token's log-probability, asked for or not.
            logprobs=(sampling.logprobs or 0) if ranked else sampling.logprobs,
            # The prompt is the same for all: one child computes its log-probabilities.
            prompt_logprobs=sampling.prompt_logprobs and index == 0),
    )


def _relabel(event: RequestOutput, request: GenerationRequest, index: int) -> RequestOutput:
    return dataclasses.replace(event, request_id=request.request_id, index=index,
                               logprobs=event.logprobs if request.sampling.logprobs is not None
                               else ())


def _cumulative_logprob(events: list[RequestOutput]) -> float:
    return sum(logprob.logprob for event in events for logprob in event.logprobs)
