"""vLLM's sampling parameters as the engine reads them (MindIE's names), shared by the
gateway (vLLM's /generate, and its OpenAI server's extras) and the server (Triton's vLLM
backend): vLLM's own defaults hold, 16 new tokens and sampling at temperature 1; temperature
0 is greedy, top_k -1 no cut, seeds are int64s."""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping

# vLLM's names of the parameters whose MindIE names differ.
NAMES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens",
         "truncate_prompt_tokens": "truncate"}
DEFAULT_MAX_TOKENS = 16  # vLLM's SamplingParams default
INT64 = range(-2**63, 2**63)
UINT64_SPAN = 2**64
# vLLM's values that mean "none": no top-k cut, and a random seed.
NO_TOP_K = -1
RANDOM_SEED = -1


def refusal(values: Mapping[str, object]) -> tuple[str, str] | None:
    """The first of vLLM's rules that `values` (under MindIE's names) breaks where its ranges
    are not MindIE's, which the engine checks: a temperature in [0, inf) (0: greedy) and an
    int64 seed (-1: random). (field, reason), or None when both hold."""
    temperature = values.get("temperature")
    if temperature is not None and (isinstance(temperature, bool)
                                    or not isinstance(temperature, int | float)
                                    or not temperature >= 0):
        return "temperature", ("must be a number in [0, inf) (0: greedy); got "
                               f"{json.dumps(temperature)}")
    seed = values.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                             or seed not in INT64):
        return "seed", (f"must be an integer in [{INT64.start}, {INT64.stop - 1}] (-1: random); "
                        f"got {json.dumps(seed)}")
    return None


def apply_vllm_defaults(values: MutableMapping[str, object],
                        max_new_tokens: int | None = DEFAULT_MAX_TOKENS) -> None:
    """vLLM's readings of `values` (under MindIE's names, `refusal` passed): temperature 0 is
    greedy, top_k -1 no cut, the seed an int64 (see `seed_as_uint64`); `max_new_tokens` when
    none is given (None: the server's)."""
    if max_new_tokens is not None:
        values.setdefault("max_new_tokens", max_new_tokens)
    if values.get("temperature") == 0:
        del values["temperature"]
        values["do_sample"] = False
    else:
        values.setdefault("do_sample", True)
    if values.get("top_k") == NO_TOP_K:
        values["top_k"] = 0
    if "seed" in values:
        seed = seed_as_uint64(values.pop("seed"))
        if seed is not None:
            values["seed"] = seed


def seed_as_uint64(seed: int) -> int | None:
    """vLLM's seed (an int64) as the engine's (a uint64): -1 is none (a random seed), as
    vLLM reads it; another negative seed is its two's complement, seed + 2^64 (as torch reads
    a negative seed), so that every int64 keeps its own seed."""
    return None if seed == RANDOM_SEED else seed % UINT64_SPAN
