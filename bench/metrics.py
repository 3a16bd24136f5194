"""One row of figures, the same for a server concurrency level and a transformers baseline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import psutil

from switchboard.process import ServerProcess


@dataclass(frozen=True, slots=True)
class Row:
    """Throughput and latency of one run. Times are in seconds; percentiles are NaN when
    there is nothing to measure (e.g. every request failed). TPOT: per request, the time after
    its first token over its other tokens; ITL: the gaps between a stream's tokens (NaN where
    nothing streams), where a stall shows even when a request's average hides it, and which
    are mostly zero where a step gives a request several tokens (speculation).
    joining_ttft_p50_s: TTFT of the requests that joined other streams already decoding (not a
    level's opening burst)."""

    name: str
    streams: int
    requests: int
    errors: int
    generated_tokens: int
    wall_s: float
    cpu_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    itl_p99_s: float = float("nan")
    joining_ttft_p50_s: float = float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def cpu_percent(self) -> float:
        """CPU time of the process that generated, over the wall time (200 = two cores busy)."""
        return 100 * self.cpu_s / self.wall_s if self.wall_s > 0 else float("nan")


def make_row(name: str, streams: int, requests: int, errors: int, generated_tokens: int,
             wall_s: float, cpu_s: float, ttfts: Sequence[float], tpots: Sequence[float],
             gaps: Sequence[float] = (), joining_ttfts: Sequence[float] = ()) -> Row:
    return Row(name=name, streams=streams, requests=requests, errors=errors,
               generated_tokens=generated_tokens, wall_s=wall_s, cpu_s=cpu_s,
               ttft_p50_s=percentile(ttfts, 50), ttft_p99_s=percentile(ttfts, 99),
               tpot_p50_s=percentile(tpots, 50), tpot_p99_s=percentile(tpots, 99),
               itl_p99_s=percentile(gaps, 99), joining_ttft_p50_s=percentile(joining_ttfts, 50))


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def cpu_seconds(server: ServerProcess) -> float:
    """User and system CPU time the server has used so far, all its threads together."""
    times = psutil.Process(server.process.pid).cpu_times()
    return times.user + times.system
