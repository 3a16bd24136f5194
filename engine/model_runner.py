"""Runs the model for one sequence at a time, keeping its KV cache between steps.

This is the simple runner the foundation needs; batching over a paged KV cache replaces it
behind the same two calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from transformers import DynamicCache, PreTrainedModel


class ModelRunner(Protocol):
    def prefill(self, token_ids: Sequence[int]) -> tuple[torch.Tensor, object]:
        """Run the prompt; return the last position's logits and the sequence's state."""

    def decode(self, token_id: int, state: object) -> torch.Tensor:
        """Run one more token of a sequence; return its logits (state is updated in place)."""


class TransformersRunner:
    def __init__(self, model: PreTrainedModel, device: torch.device) -> None:
        self._model = model
        self._device = device

    @torch.inference_mode()
    def prefill(self, token_ids: Sequence[int]) -> tuple[torch.Tensor, object]:
        cache = DynamicCache(config=self._model.config)
        logits = self._forward(list(token_ids), cache)
        return logits, cache

    @torch.inference_mode()
    def decode(self, token_id: int, state: object) -> torch.Tensor:
        return self._forward([token_id], state)

    def _forward(self, token_ids: list[int], cache: object) -> torch.Tensor:
        input_ids = torch.tensor([token_ids], device=self._device)
        output = self._model(input_ids=input_ids, past_key_values=cache, use_cache=True,
                             logits_to_keep=1)
        return output.logits[0, -1]
