"""vLLM's sampling parameters as the engine reads them (MindIE's names), shared by the
gateway (vLLM's /generate) and the server (Triton's vLLM backend): vLLM's own defaults hold,
16 new tokens and sampling at temperature 1; temperature 0 is greedy, top_k -1 no cut."""

from __future__ import annotations

from collections.abc import MutableMapping

# vLLM's names of the parameters whose MindIE names differ.
NAMES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
DEFAULT_MAX_TOKENS = 16  # vLLM's SamplingParams default


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
