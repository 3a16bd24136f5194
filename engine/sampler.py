"""Turns one step's logits into the next token of every request that samples.

Penalties, logit biases, allowed tokens, structured output and min-token masks apply row by
row; greedy rows are one argmax for the batch. Sampled rows follow transformers' order
(temperature, top-k, top-p, min-p, typical-p) and draw with the exponential race (argmax of
p / Exp(1) noise, equivalent to drawing from p) from the request's own seeded generator, so a
seed reproduces its draws whatever else runs; the logits they are drawn from are the same bits
whatever else runs only with deterministic inference (docs/engine.md#deterministic-inference).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import torch

from switchboard.engine.guided import allowed_tokens
from switchboard.engine.params import SamplingParams
from switchboard.engine.request import Request, TokenLogprob


def make_generator(seed: int) -> torch.Generator:
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    return generator


def sample_batch(logits: torch.Tensor, requests: Sequence[Request],
                 eos_token_ids: Collection[int]) -> list[tuple[int, TokenLogprob | None]]:
    """logits: [len(requests), vocab] float32, on any device. The batch's argmax is taken
    where the logits are, so that a step of plain greedy requests sends back from an
    accelerator only their token ids; the rows of the other requests (sampling, penalties,
    log-probabilities, masked early stops) are copied to the host at once and worked on
    there (logits already on the host are modified in place)."""
    if not requests:
        return []
    results: list[tuple[int, TokenLogprob | None]] = [
        (token, None) for token in logits.argmax(dim=-1).tolist()]
    detailed = [row for row, request in enumerate(requests)
                if _needs_row_work(request, eos_token_ids)]
    if not detailed:
        return results
    host_rows = logits[detailed].cpu() if not logits.is_cpu else [logits[row] for row in detailed]
    for host_row, row in zip(host_rows, detailed):
        request = requests[row]
        params = request.spec.sampling
        raw_logprobs = (torch.log_softmax(host_row, dim=-1) if params.logprobs is not None
                        else None)
        _apply_penalties(host_row, request)
        _apply_logit_bias(host_row, params)
        _allow_only(host_row, params.allowed_token_ids)
        if request.guide is not None:
            host_row.masked_fill_(~allowed_tokens(request.guide, host_row.numel()), -torch.inf)
        _mask_early_stops(host_row, request, eos_token_ids)
        token = (sample_row(host_row, params, request.generator) if params.do_sample
                 else int(host_row.argmax()))
        results[row] = (token, None if raw_logprobs is None
                        else _logprob(raw_logprobs, token, params.logprobs))
    return results


def _needs_row_work(request: Request, eos_token_ids: Collection[int]) -> bool:
    params = request.spec.sampling
    return (params.do_sample or params.logprobs is not None or params.repetition_penalty != 1.0
            or bool(params.logit_bias) or params.allowed_token_ids is not None
            or request.guide is not None or _has_count_penalties(request)
            or bool(_early_stops(request, eos_token_ids)))


def _has_count_penalties(request: Request) -> bool:
    """Presence or frequency penalties, with generated tokens to count."""
    params = request.spec.sampling
    return bool(params.presence_penalty or params.frequency_penalty) and bool(
        request.output_token_ids)


def _early_stops(request: Request, eos_token_ids: Collection[int]) -> set[int]:
    """The tokens that would end the request before its min_new_tokens."""
    params = request.spec.sampling
    if len(request.output_token_ids) >= params.min_new_tokens:
        return set()
    return set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))


def sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    logits = logits / params.temperature
    if 0 < params.top_k < logits.numel():
        kth_largest = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth_largest, -torch.inf)
    if params.top_p < 1.0:
        logits = _top_p(logits, params.top_p)
    if params.min_p > 0.0:
        logits = _min_p(logits, params.min_p)
    if params.typical_p < 1.0:
        logits = _typical_p(logits, params.typical_p)
    probs = torch.softmax(logits, dim=-1)
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return int(torch.argmax(probs / noise))


def _apply_penalties(logits: torch.Tensor, request: Request) -> None:
    params = request.spec.sampling
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(request.all_token_ids).unique()
        scores = logits[seen]
        # CTRL-style: move a seen token's logit towards "less likely" whatever its sign.
        logits[seen] = torch.where(scores < 0, scores * params.repetition_penalty,
                                   scores / params.repetition_penalty)
    if _has_count_penalties(request):
        counts = torch.bincount(torch.tensor(request.output_token_ids),
                                minlength=logits.numel()).to(logits.dtype)
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)


def _apply_logit_bias(logits: torch.Tensor, params: SamplingParams) -> None:
    if params.logit_bias:
        token_ids, biases = zip(*params.logit_bias)
        logits.index_add_(0, torch.tensor(token_ids), torch.tensor(biases, dtype=logits.dtype))


def _allow_only(logits: torch.Tensor, allowed: frozenset[int] | None) -> None:
    if allowed is not None:
        token_ids = list(allowed)
        kept = logits[token_ids]
        logits.fill_(-torch.inf)
        logits[token_ids] = kept


def _mask_early_stops(logits: torch.Tensor, request: Request,
                      eos_token_ids: Collection[int]) -> None:
    """Ban the tokens that would end the request before min_new_tokens, unless nothing else
    is allowed (a complete structured output, allowed_token_ids of stops only): then the
    request ends early rather than choose a token it may not."""
    banned = list(_early_stops(request, eos_token_ids))
    if banned:
        others = logits.clone()
        others[banned] = -torch.inf
        if torch.isfinite(others).any():
            logits.copy_(others)


def _logprob(logprobs: torch.Tensor, token: int, num_top: int) -> TokenLogprob:
    top = torch.topk(logprobs, num_top) if num_top else None
    alternatives = tuple(zip(top.indices.tolist(), top.values.tolist())) if top is not None else ()
    return TokenLogprob(token_id=token, logprob=float(logprobs[token]), top=alternatives)


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches top_p."""
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    drop_sorted = probs.cumsum(dim=-1) - probs >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, -torch.inf)


def _min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep the tokens at least min_p times as likely as the most likely one."""
    log_probs = torch.log_softmax(logits, dim=-1)
    return logits.masked_fill(log_probs < log_probs.max() + math.log(min_p), -torch.inf)


def _typical_p(logits: torch.Tensor, typical_p: float) -> torch.Tensor:
    """Locally typical sampling (Meister et al.): keep tokens whose surprisal is closest to the
    distribution's entropy until their mass reaches typical_p."""
    log_probs = torch.log_softmax(logits, dim=-1)
    probs = log_probs.exp()
    entropy = -torch.nansum(probs * log_probs)
    order = torch.argsort((-log_probs - entropy).abs())
    drop_sorted = probs[order].cumsum(dim=-1) - probs[order] >= typical_p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, -torch.inf)
