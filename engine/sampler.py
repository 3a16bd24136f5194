"""Turns one step's logits into the next token of one request.

The order of the logits processors is transformers': repetition penalty, then temperature,
top-k, top-p and typical-p. Each request draws from its own seeded generator, so its output
does not depend on what else is running.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.params import SamplingParams


def make_generator(seed: int) -> torch.Generator:
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    return generator


def sample_next_token(logits: torch.Tensor, params: SamplingParams, seen_token_ids: Sequence[int],
                      generator: torch.Generator) -> int:
    """logits: 1-D over the vocabulary; seen_token_ids: prompt and generated tokens so far."""
    logits = logits.float()
    if params.repetition_penalty != 1.0 and seen_token_ids:
        logits = _apply_repetition_penalty(logits, seen_token_ids, params.repetition_penalty)
    if not params.do_sample:
        return int(torch.argmax(logits))
    logits = logits / params.temperature
    if 0 < params.top_k < logits.numel():
        kth_largest = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth_largest, -torch.inf)
    if params.top_p < 1.0:
        logits = _top_p(logits, params.top_p)
    if params.typical_p < 1.0:
        logits = _typical_p(logits, params.typical_p)
    probs = torch.softmax(logits, dim=-1).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


def _apply_repetition_penalty(logits: torch.Tensor, token_ids: Sequence[int],
                              penalty: float) -> torch.Tensor:
    """CTRL-style penalty: shrink a seen token's logit towards "less likely" whatever its sign."""
    ids = torch.tensor(sorted(set(token_ids)), device=logits.device)
    seen = logits[ids]
    logits = logits.clone()
    logits[ids] = torch.where(seen < 0, seen * penalty, seen / penalty)
    return logits


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches top_p."""
    sorted_logits, order = torch.sort(logits, descending=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, -torch.inf)


def _typical_p(logits: torch.Tensor, typical_p: float) -> torch.Tensor:
    """Locally typical sampling (Meister et al.): keep tokens whose surprisal is closest to the
    distribution's entropy until their mass reaches typical_p."""
    log_probs = torch.log_softmax(logits, dim=-1)
    probs = log_probs.exp()
    entropy = -torch.nansum(probs * log_probs)
    distance = (-log_probs - entropy).abs()
    sorted_distance, order = torch.sort(distance)
    cumulative = probs[order].cumsum(dim=-1)
    drop_sorted = cumulative - probs[order] >= typical_p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, -torch.inf)
