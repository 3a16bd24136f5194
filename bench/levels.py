"""A concurrency level of closed-loop load, whatever the protocol: C workers, each sending its
next request when the previous one finishes, timing each request's streamed tokens."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from bench.metrics import Row, make_row

Prompt = tuple[int, ...]


@dataclass(slots=True)
class Timing:
    """What one request measured: seconds to its first token, the gap before each token
    after it (a response of several tokens shares its gap among them). joins_running: sent by
    a worker after its first request, so into a batch of other streams decoding, rather than
    in the level's opening burst."""

    joins_running: bool
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Seconds per output token after the first (vLLM's TPOT, the baseline's)."""
        return sum(self.gaps_s) / len(self.gaps_s) if self.gaps_s else None

    def add_tokens(self, count: int, since_start_s: float, since_last_s: float) -> None:
        """`count` tokens arrived in one response."""
        if self.ttft_s is None:
            self.ttft_s = since_start_s
        else:
            self.gaps_s.extend([since_last_s / count] * count)
        self.tokens += count


@dataclass(frozen=True, slots=True)
class LevelResult:
    row: Row
    errors: list[str]


# Sends one prompt (joins_running: see Timing) and times it.
Send = Callable[[Prompt, bool], Awaitable[Timing]]


async def run_level(name: str, streams: int, prompts: Sequence[Prompt], send: Send,
                    cpu_seconds: Callable[[], float]) -> LevelResult:
    """Send `prompts` through `streams` closed-loop workers; `cpu_seconds` reads the serving
    processes' CPU time, for their utilisation over the level."""
    pending = iter(prompts)
    timings: list[Timing] = []

    async def worker() -> None:
        for index, prompt in enumerate(pending):
            timings.append(await send(prompt, index > 0))

    cpu_start, start = cpu_seconds(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(streams)))
    wall_s = time.perf_counter() - start
    cpu_s = cpu_seconds() - cpu_start
    errors = [timing.error for timing in timings if timing.error is not None]
    row = make_row(name, streams, len(timings), len(errors), sum(t.tokens for t in timings),
                   wall_s, cpu_s, [t.ttft_s for t in timings if t.ttft_s is not None],
                   [t.tpot_s for t in timings if t.tpot_s is not None],
                   [gap for t in timings for gap in t.gaps_s],
                   [t.ttft_s for t in timings if t.ttft_s is not None and t.joins_running])
    return LevelResult(row, errors)
