"""Attention over the paged KV cache for a whole batch in one call per layer.

The batch's tokens arrive flat ([tokens, heads, head_dim]); each sequence's new K/V are
written into its blocks' slots, then every sequence's context is gathered from the cache
into a padded [sequences, context] layout and attended with one
`scaled_dot_product_attention` call under a causal-and-padding mask. This pure-torch path
runs on any device; on CUDA, SDPA picks its fused kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from engine.paged_runner import SequenceChunk


@dataclass(frozen=True, slots=True)
class AttentionBatch:
    """Index tensors shared by every layer of one step."""

    token_ids: torch.Tensor      # [T] flat tokens of all chunks
    positions: torch.Tensor      # [T]
    write_slots: torch.Tensor    # [T] cache slot of each new token
    query_index: torch.Tensor    # [B, Qmax] flat index of each sequence's queries (padded)
    context_slots: torch.Tensor  # [B, Lmax] cache slots of each sequence's context (padded)
    mask: torch.Tensor           # [B, 1, Qmax, Lmax] True where a query may attend
    unpad_index: torch.Tensor    # [T] position of each flat token in the padded [B*Qmax]
    sample_index: torch.Tensor   # [S] flat index of the last token of each sampling chunk

    @classmethod
    def build(cls, chunks: Sequence[SequenceChunk], block_size: int,
              device: torch.device) -> AttentionBatch:
        q_lens = [len(chunk.token_ids) for chunk in chunks]
        context_lens = [chunk.start + n for chunk, n in zip(chunks, q_lens)]
        q_max, l_max = max(q_lens), max(context_lens)
        token_ids: list[int] = []
        positions: list[int] = []
        query_index = torch.zeros(len(chunks), q_max, dtype=torch.long)
        context_slots = torch.zeros(len(chunks), l_max, dtype=torch.long)
        unpad_index: list[int] = []
        sample_index: list[int] = []
        write_slots: list[torch.Tensor] = []
        for row, (chunk, q_len, context_len) in enumerate(zip(chunks, q_lens, context_lens)):
            slots = _slots(chunk.block_ids, context_len, block_size)
            first = len(token_ids)
            token_ids.extend(chunk.token_ids)
            positions.extend(range(chunk.start, context_len))
            write_slots.append(slots[chunk.start:])
            query_index[row, :q_len] = torch.arange(first, first + q_len)
            context_slots[row, :context_len] = slots
            unpad_index.extend(range(row * q_max, row * q_max + q_len))
            if chunk.samples:
                sample_index.append(first + q_len - 1)
        starts = torch.tensor([chunk.start for chunk in chunks]).view(-1, 1, 1)
        query_positions = starts + torch.arange(q_max).view(1, -1, 1)
        key_positions = torch.arange(l_max).view(1, 1, -1)
        valid_query = torch.arange(q_max).view(1, -1, 1) < torch.tensor(q_lens).view(-1, 1, 1)
        # Padded query rows attend to slot 0 only, so no row of the softmax is empty.
        mask = (key_positions <= query_positions) & valid_query | (key_positions == 0)
        return cls(
            token_ids=torch.tensor(token_ids, device=device),
            positions=torch.tensor(positions, device=device),
            write_slots=torch.cat(write_slots).to(device),
            query_index=query_index.to(device),
            context_slots=context_slots.to(device),
            mask=mask.unsqueeze(1).to(device),
            unpad_index=torch.tensor(unpad_index, device=device),
            sample_index=torch.tensor(sample_index, device=device, dtype=torch.long),
        )


def _slots(block_ids: Sequence[int], num_tokens: int, block_size: int) -> torch.Tensor:
    token_positions = torch.arange(num_tokens)
    blocks = torch.tensor(block_ids, dtype=torch.long)
    return blocks[token_positions // block_size] * block_size + token_positions % block_size


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D]; caches [slots, Hkv, D]. Returns [T, H*D]."""
    k_cache.index_copy_(0, batch.write_slots, k)
    v_cache.index_copy_(0, batch.write_slots, v)
    # A pure decode step (one query per sequence) needs no padding: the flat tokens are the rows.
    decode_only = batch.query_index.shape[1] == 1
    queries = (q.unsqueeze(1) if decode_only else q[batch.query_index]).transpose(1, 2)
    keys = k_cache[batch.context_slots].transpose(1, 2)         # [B, Hkv, Lmax, D]
    values = v_cache[batch.context_slots].transpose(1, 2)
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=batch.mask,
                                         enable_gqa=True)           # [B, H, Qmax, D]
    out = out.transpose(1, 2).reshape(-1, q.shape[1] * q.shape[2])  # [B*Qmax, H*D]
    return out if decode_only else out[batch.unpad_index]
