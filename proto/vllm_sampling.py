"""vLLM's sampling parameters as the engine reads them (MindIE's names), shared by the
gateway (vLLM's /generate) and the server (Triton's vLLM backend): vLLM's own defaults hold,
16 new tokens and sampling at temperature 1; temperature 0 is greedy, top_k -1 no cut."""

from __future__ import annotations

from collections.abc import MutableMapping

# vLLM's names of the parameters whose MindIE names differ.
NAMES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens",
         "truncate_prompt_tokens": "truncate"}
DEFAULT_MAX_TOKENS = 16  # vLLM's SamplingParams default
INT64 = range(-2**63, 2**63)
UINT64_SPAN = 2**64


def seed_as_uint64(seed: int) -> int | None:
    """vLLM's seed (an int64) as the engine's (a uint64): -1 is none (a random seed), as
    vLLM reads it; another negative seed is its two's complement, seed + 2^64 (as torch reads
    a negative seed), so that every int64 keeps its own seed. A seed beyond the int64s goes on
    as it is, for the engine to refuse."""
    if seed == -1:
        return None
    return seed % UINT64_SPAN if seed in INT64 else seed


def apply_vllm_defaults(values: MutableMapping[str, object]) -> None:
    """values: under MindIE's names already."""
    values.setdefault("max_new_tokens", DEFAULT_MAX_TOKENS)
    if values.get("temperature") == 0:
        del values["temperature"]
        values["do_sample"] = False
    else:
        values.setdefault("do_sample", True)
    if values.get("top_k") == -1:
        values["top_k"] = 0
