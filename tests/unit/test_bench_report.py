"""`python -m bench --against-llama-server PATH` reports issue 41's goals 3 and 4 as ratios of
the same levels run against both servers; here from rows of known figures, without the
binary."""

from __future__ import annotations

import math
import re

from bench.metrics import make_row
from bench.report import GIB, llama_server_targets, text_table


def row(name: str, streams: int, tokens_per_s: float, ttft_s: float, tpot_s: float):
    return make_row(name, streams, requests=streams, errors=0,
                    generated_tokens=int(tokens_per_s * 10), wall_s=10.0, cpu_s=10.0,
                    ttfts=[ttft_s], tpots=[tpot_s])


def test_the_ratios_to_llama_server_are_the_issues_goals() -> None:
    ours = {1: row("openai, 1 stream", 1, 130, 0.086, 1 / 140),
            16: row("openai, 16 streams", 16, 400, 0.42, 0.03),
            64: row("openai, 64 streams", 64, 470, 1.8, 0.1)}
    theirs = {1: row("llama-server, 1 stream", 1, 120, 0.268, 1 / 135),
              16: row("llama-server, 16 streams", 16, 210, 1.8, 0.06),
              64: row("llama-server, 64 streams", 64, 240, 4.8, 0.2)}
    goals = {goal.name: goal for goal in llama_server_targets(ours, theirs, int(1.2 * GIB))}
    decode = goals["1 stream decode tokens/s ÷ llama-server's"]
    assert math.isclose(decode.value, 140 / 135) and decode.status == "PASS"
    ttft = goals["1 stream TTFT ÷ llama-server's"]
    assert math.isclose(ttft.value, 0.086 / 0.268) and ttft.status == "PASS"
    assert math.isclose(goals["16 streams tokens/s ÷ llama-server's"].value, 400 / 210)
    assert goals["16 streams tokens/s ÷ llama-server's"].status == "MISS"
    assert math.isclose(goals["64 streams tokens/s ÷ llama-server's"].value, 470 / 240)
    assert goals["64 streams tokens/s ÷ llama-server's"].status == "MISS"
    assert goals["16 streams TTFT p50, s"].status == "PASS"
    assert goals["server peak RSS, GiB"].status == "PASS"
    table = text_table([*ours.values(), *theirs.values()], list(goals.values()))
    assert re.search(r"1 stream TTFT ÷ llama-server's +0\.32 +≤ 0\.5 +PASS", table)


def test_a_level_run_against_one_server_only_is_not_compared() -> None:
    ours = {1: row("openai, 1 stream", 1, 90, 0.09, 1 / 92)}
    theirs = {1: row("llama-server, 1 stream", 1, 120, 0.27, 1 / 135),
              16: row("llama-server, 16 streams", 16, 210, 1.8, 0.06)}
    goals = {goal.name: goal for goal in llama_server_targets(ours, theirs, int(1.6 * GIB))}
    assert goals["1 stream decode tokens/s ÷ llama-server's"].status == "MISS"
    assert [goals[name].status for name in ("16 streams tokens/s ÷ llama-server's",
                                            "64 streams tokens/s ÷ llama-server's",
                                            "16 streams TTFT p50, s")] == ["n/a"] * 3
    assert goals["server peak RSS, GiB"].status == "MISS"
