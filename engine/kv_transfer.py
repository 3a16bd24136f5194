"""Prefill/decode disaggregation, the engine's part: a prefill's KV cache leaves one engine
(`PrefilledKV`, read from blocks the prefill instance keeps under a lease) and enters
another, which then decodes as if it had computed that prompt itself.

The decode side recomputes the prompt's last token rather than taking the prefill's first
sampled one: that one token's step gives the logits of the first generated token, so the
decode side samples every token itself, from a fresh seeded generator, with its own penalties
and structured-output guide, and its output is the same as one instance's, with no sampler
state to move between processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

import torch

from switchboard.engine.errors import InvalidRequest

# The field a refused transfer names, in every protocol (vLLM's request field).
KV_TRANSFER_FIELD = "kv_transfer_params"


@dataclass(frozen=True, slots=True)
class KVLayout:
    """What a KV cache's tensors are: two engines exchange them only if these agree.
    model: the weights' shape and quantization, as the runner describes it."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    model: str

    def check_matches(self, local: KVLayout) -> None:
        """Refuse a transfer from an engine whose KV cache differs from this one's."""
        if self != local:
            differences = ", ".join(
                f"{name} {getattr(self, name)!r} (here {getattr(local, name)!r})"
                for name in self.__dataclass_fields__ if getattr(self, name) != getattr(local, name))
            raise InvalidRequest(KV_TRANSFER_FIELD,
                                 f"the prefill instance's KV cache does not match this one's: "
                                 f"{differences}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def tensor_shape(self, num_tokens: int) -> tuple[int, int, int, int]:
        return (self.num_layers, num_tokens, self.num_kv_heads, self.head_dim)


@dataclass(frozen=True, slots=True)
class PrefilledKV:
    """The keys and values of a prompt's first len(token_ids) tokens, each
    [layers, tokens, kv heads, head dim] on the host."""

    layout: KVLayout
    token_ids: tuple[int, ...]
    keys: torch.Tensor
    values: torch.Tensor

    def check_prompt(self, prompt_token_ids: Sequence[int]) -> None:
        """Refuse KV computed for another prompt (a different template, tokenizer or text)."""
        expected = self.layout.tensor_shape(len(self.token_ids))
        if tuple(self.keys.shape) != expected or tuple(self.values.shape) != expected:
            raise InvalidRequest(KV_TRANSFER_FIELD, f"the transferred KV has shape "
                                 f"{tuple(self.keys.shape)}; {expected} was announced")
        if len(self.token_ids) >= len(prompt_token_ids) \
                or tuple(prompt_token_ids[:len(self.token_ids)]) != self.token_ids:
            raise InvalidRequest(KV_TRANSFER_FIELD, "the prefill instance computed another "
                                 "prompt than this request's")
