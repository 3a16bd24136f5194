"""Validated per-request parameters: what the sampler and the scheduler read."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from switchboard.engine.errors import RequestTimedOut

DEFAULT_PRIORITY = 5
DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class OutputPattern:
    """The regular expression a request's text must match (structured output, see
    `guided.py`); `field` is the request parameter it came from, which errors name."""

    field: str
    regex: str


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling semantics follow MindIE's parameter table.

    top_k == 0 means no top-k cut, min_p == 0 no min-p cut; max_new_tokens is already capped
    by maxIterTimes and by what fits in maxSeqLen after the prompt; seed is always set (drawn
    when absent).
    Presence and frequency penalties (OpenAI's) apply to generated tokens; the repetition
    penalty (CTRL's) to prompt and generated tokens. Before min_new_tokens are generated,
    neither EOS nor a stop token nor a stop string ends the request. The text ends before the
    stop string that ended it, or after it with include_stop_str_in_output. logprobs: None for none,
    else report each chosen token's log-probability and this many top alternatives.
    n sequences are returned, the best of best_of generated (see engine/fanout.py).
    prompt_logprobs: report each prompt token's log-probability under the model (TGI's
    decoder_input_details), with `logprobs` top alternatives, on the first token event; such a
    request reuses no cached prefix, since every prompt position must be computed.
    logit_bias: (token id, bias) pairs added to the logits before a token is chosen, after the
    penalties (OpenAI's logit_bias); allowed_token_ids: when given, the only tokens that may be
    chosen (vLLM's); log-probabilities stay the model's own. skip_special_tokens: the text
    leaves out special tokens generated (with ignore_eos, EOS); the token that ends a request
    is never in it. pattern: the text must match it: EOS may follow a complete match, and
    must follow one that cannot go on (vLLM's guided_json, guided_regex, guided_choice).
    """

    do_sample: bool
    seed: int
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    min_new_tokens: int = 0
    logprobs: int | None = None
    n: int = 1
    best_of: int = 1
    prompt_logprobs: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    skip_special_tokens: bool = True
    allowed_token_ids: frozenset[int] | None = None
    pattern: OutputPattern | None = None


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One validated request, as every protocol hands it to the engine. A probe (MindIE's
    /health/timed inference) checks that the engine generates: it goes ahead of every other
    request, past the in-flight and running limits, so that a busy server is not reported
    broken."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    priority: int = DEFAULT_PRIORITY
    timeout_s: float = DEFAULT_TIMEOUT_S
    probe: bool = False
    # A prefill for another engine to decode (vLLM's do_remote_decode): once finished, its
    # KV cache stays, under a lease, for that engine to read (see `kv_transfer.py`).
    keep_kv: bool = False


def time_left(request: GenerationRequest, since: float) -> GenerationRequest:
    """The request to start now, having come at `since` (monotonic): its timeout less the time
    it has waited. Raises RequestTimedOut when none is left."""
    left = request.timeout_s - (time.monotonic() - since)
    if left <= 0:
        raise RequestTimedOut.after(request.timeout_s)
    return dataclasses.replace(request, timeout_s=left)
