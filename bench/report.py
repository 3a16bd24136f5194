"""The results: an aligned text table, the project's targets as PASS/MISS, and
`<stem>.json`, `<stem>.md` and `<stem>.png` in the results folder."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.metrics import Row

GIB = 1024 ** 3
HEADERS = ("run", "streams", "requests", "errors", "tokens/s", "TTFT p50 ms", "TTFT p99 ms",
           "joining TTFT p50 ms", "TPOT p50 ms", "TPOT p99 ms", "ITL p99 ms", "CPU %")


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    value: float
    goal: str
    met: Callable[[float], bool]

    @property
    def status(self) -> str:
        if math.isnan(self.value):
            return "n/a"
        return "PASS" if self.met(self.value) else "MISS"


def targets(levels: Mapping[int, Row], one_at_a_time: Row, batch: Row,
            server_peak_rss: int) -> list[Target]:
    """The project's targets, as ratios to the baselines (NaN where a level was not run)."""
    single, sixteen, high = (levels.get(streams) for streams in (1, batch.streams, 64))
    nan = float("nan")
    return [
        Target("1 stream tokens/s ÷ transformers one at a time",
               single.tokens_per_s / one_at_a_time.tokens_per_s if single else nan, "≥ 1.5",
               lambda value: value >= 1.5),
        Target(f"{batch.streams} streams tokens/s ÷ transformers static batch",
               sixteen.tokens_per_s / batch.tokens_per_s if sixteen else nan, "≥ 1.3",
               lambda value: value >= 1.3),
        Target(f"ITL p99 ÷ TPOT p50 at {batch.streams} streams",
               sixteen.itl_p99_s / sixteen.tpot_p50_s if sixteen else nan, "< 3",
               lambda value: value < 3),
        Target(f"64 streams tokens/s ÷ {batch.streams} streams tokens/s",
               high.tokens_per_s / sixteen.tokens_per_s if high and sixteen else nan, "> 1",
               lambda value: value > 1),
        Target("server peak RSS, GiB", server_peak_rss / GIB, "< 2", lambda value: value < 2),
    ]


def quantized_targets(levels: Mapping[int, Row], one_at_a_time: Row, batch: Row,
                      server_peak_rss: int) -> list[Target]:
    """Targets of a quantized run (issue 8): decode speed of one stream (1 / TPOT p50),
    throughput at 64 streams against transformers' static batch of 64, time to first token
    at 16 streams of the requests that join while the others decode (the level's opening
    burst of 16 prompts at once is not that case), memory."""
    single, sixteen, high = (levels.get(streams) for streams in (1, 16, 64))
    nan = float("nan")
    return [
        Target("1 stream decode tokens/s (1 / TPOT p50)",
               1 / single.tpot_p50_s if single else nan, "≥ 100", lambda value: value >= 100),
        Target("1 stream decode ÷ transformers float32 one at a time",
               one_at_a_time.tpot_p50_s / single.tpot_p50_s if single else nan, "≥ 4",
               lambda value: value >= 4),
        Target("64 streams tokens/s", high.tokens_per_s if high else nan, "≥ 250",
               lambda value: value >= 250),
        Target(f"64 streams tokens/s ÷ transformers static batch of {batch.streams}",
               high.tokens_per_s / batch.tokens_per_s if high else nan, "≥ 1.6",
               lambda value: value >= 1.6),
        Target("16 streams TTFT p50 joining the others decoding, s",
               sixteen.joining_ttft_p50_s if sixteen else nan, "≤ 1", lambda value: value <= 1),
        peak_rss_target(server_peak_rss),
    ]


def peak_rss_target(server_peak_rss: int) -> Target:
    return Target("server peak RSS, GiB", server_peak_rss / GIB, "≤ 1.5",
                  lambda value: value <= 1.5)


def llama_server_targets(ours: Mapping[int, Row], theirs: Mapping[int, Row],
                         server_peak_rss: int) -> list[Target]:
    """Issue 41's goals 3 and 4: Switchboard's OpenAI route through the gateway (mutual TLS)
    against llama.cpp's llama-server on the same GGUF file, same prompts, same client, by
    level (NaN where a level was not run on both). One stream decodes at least as fast (1 /
    TPOT p50) with at most half the time to first token; at 16 and 64 streams at least twice
    the aggregate tokens/s; TTFT p50 at 16 streams at most 0.5 s; peak RSS at most 1.5 GiB."""
    nan = float("nan")

    def both(streams: int) -> tuple[Row, Row] | None:
        return (ours[streams], theirs[streams]) if streams in ours and streams in theirs \
            else None

    single, sixteen, high = both(1), both(16), both(64)
    return [
        Target("1 stream decode tokens/s ÷ llama-server's",
               single[1].tpot_p50_s / single[0].tpot_p50_s if single else nan, "≥ 1.0",
               lambda value: value >= 1.0),
        Target("1 stream TTFT ÷ llama-server's",
               single[0].ttft_p50_s / single[1].ttft_p50_s if single else nan, "≤ 0.5",
               lambda value: value <= 0.5),
        *(Target(f"{streams} streams tokens/s ÷ llama-server's",
                 pair[0].tokens_per_s / pair[1].tokens_per_s if pair else nan, "≥ 2",
                 lambda value: value >= 2) for streams, pair in ((16, sixteen), (64, high))),
        Target("16 streams TTFT p50, s", sixteen[0].ttft_p50_s if sixteen else nan, "≤ 0.5",
               lambda value: value <= 0.5),
        peak_rss_target(server_peak_rss),
    ]


def text_table(rows: Sequence[Row], goals: Sequence[Target]) -> str:
    cells = [HEADERS, *(_cells(row) for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                       for i, (cell, width) in enumerate(zip(line, widths, strict=True)))
             for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    name_width = max(len(goal.name) for goal in goals)
    lines += ["", "targets:"]
    lines += [f"  {goal.name.ljust(name_width)}  {_number(goal.value, 2):>7}  {goal.goal:>5}  "
              f"{goal.status}" for goal in goals]
    return "\n".join(lines)


def markdown(rows: Sequence[Row], goals: Sequence[Target]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    lines += ["", "| target | measured | goal | |", "|---|---|---|---|"]
    lines += [f"| {goal.name} | {_number(goal.value, 2)} | {goal.goal} | {goal.status} |"
              for goal in goals]
    return "\n".join(lines) + "\n"


def write_json(path: Path, rows: Sequence[Row], goals: Sequence[Target],
               details: Mapping[str, object]) -> None:
    document = {
        **details,
        "rows": [{**dataclasses.asdict(row), "tokens_per_s": row.tokens_per_s,
                  "cpu_percent": row.cpu_percent} for row in rows],
        "targets": [{"name": goal.name, "value": goal.value, "goal": goal.goal,
                     "status": goal.status} for goal in goals],
    }
    path.write_text(json.dumps(_without_nan(document), indent=2) + "\n")


def plot(path: Path, levels: Mapping[int, Row], baselines: Sequence[Row]) -> None:
    # Imported here: the report's tables and targets need no bench extras (unit tests).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = sorted(levels)
    rows = [levels[count] for count in streams]
    figure, (throughput, latency) = plt.subplots(1, 2, figsize=(12, 4.5))
    throughput.plot(streams, [row.tokens_per_s for row in rows], "o-", label="switchboard")
    for baseline, style in zip(baselines, ("--", ":", "-."), strict=False):
        throughput.axhline(baseline.tokens_per_s, linestyle=style, color="gray",
                           label=baseline.name)
    throughput.set(title="output tokens/s", xlabel="concurrent streams", ylabel="tokens/s")
    throughput.set_ylim(bottom=0)
    latency.plot(streams, [1000 * row.ttft_p50_s for row in rows], "o-", label="TTFT p50")
    latency.plot(streams, [1000 * row.tpot_p50_s for row in rows], "s-", label="TPOT p50")
    latency.set(title="latency", xlabel="concurrent streams", ylabel="ms", yscale="log")
    for axes in (throughput, latency):
        axes.set_xscale("log", base=2)
        axes.set_xticks(streams, [str(count) for count in streams])
        axes.grid(alpha=0.3)
        axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _cells(row: Row) -> tuple[str, ...]:
    milliseconds = (row.ttft_p50_s, row.ttft_p99_s, row.joining_ttft_p50_s, row.tpot_p50_s,
                    row.tpot_p99_s, row.itl_p99_s)
    return (row.name, str(row.streams), str(row.requests), str(row.errors),
            _number(row.tokens_per_s, 1), *(_number(1000 * value, 0) for value in milliseconds),
            _number(row.cpu_percent, 0))


def _number(value: float, decimals: int) -> str:
    return "–" if math.isnan(value) else f"{value:.{decimals}f}"


def _without_nan(value: object) -> object:
    """JSON has no NaN: unmeasured figures become null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _without_nan(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_nan(item) for item in value]
    return value
