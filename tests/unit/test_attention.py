"""Attention over the paged KV cache against attention computed one sequence at a time from
contiguous keys and values: decoding sequences of different context lengths, in one group or
in groups by context, alone and beside a prefilling one, with their query heads grouped by
K/V head or not, within a sliding window or not, in float32 and bf16; and how decoding
sequences are grouped by context."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from switchboard.engine import attention
from switchboard.engine.attention import (AttentionBatch, DecodeAttention, paged_attention,
                                          split_by_context)
from switchboard.engine.paged_runner import SequenceChunk

BLOCK_SIZE = 4
HEADS, KV_HEADS, HEAD_DIM = 6, 2, 16
# Block tables out of order, as a pool hands them out after requests come and go.
TABLES = [[7, 2, 9, 0], [3, 11], [5, 1, 8, 4, 10], [12, 6]]
CONTEXTS = [13, 5, 19, 8]  # tokens each sequence has in the cache, this step's included
WINDOW = 6  # shorter than all contexts but one


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
              window: int | None) -> torch.Tensor:
    """One sequence's causal attention: q [Q, H, D] for its last Q positions, keys/values
    [L, Hkv, D] for all of them; window: a sliding window's length (None: none). Returns
    [Q, H*D]."""
    queries, context = q.shape[0], keys.shape[0]
    causal = torch.ones(queries, context, dtype=torch.bool).tril(context - queries)
    if window is not None:
        causal &= torch.ones(queries, context, dtype=torch.bool).triu(context - queries
                                                                       - window + 1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1).float(),
                                         keys.transpose(0, 1).float(),
                                         values.transpose(0, 1).float(), attn_mask=causal,
                                         enable_gqa=True)
    return out.transpose(0, 1).reshape(queries, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, WINDOW], ids=["whole-context", "sliding-window"])
@pytest.mark.parametrize("decode", list(DecodeAttention), ids=lambda form: form.name.lower())
@pytest.mark.parametrize("prefilling", [0, 3], ids=["decodes-only", "beside-a-prefill"])
@pytest.mark.parametrize("group_cost", [10**6, 0], ids=["one-decode-group", "one-per-context"])
@pytest.mark.parametrize("token_by_token", [False, True], ids=["grouped", "token-by-token"])
def test_paged_attention_equals_each_sequences_own(dtype: torch.dtype, window: int | None,
                                                   decode: DecodeAttention, prefilling: int,
                                                   group_cost: int, token_by_token: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The first sequence computes `prefilling` tokens of its prompt (1: a decode), the others
    decode one token each; token by token, every token attends as a decoding row."""
    monkeypatch.setattr(attention, "GROUP_COST_SLOTS", group_cost)
    torch.manual_seed(0)
    slots = (max(max(table) for table in TABLES) + 1) * BLOCK_SIZE
    k_cache = torch.randn(slots, KV_HEADS, HEAD_DIM).to(dtype)
    v_cache = torch.randn(slots, KV_HEADS, HEAD_DIM).to(dtype)
    new_tokens = [max(prefilling, 1), 1, 1, 1]
    chunks = [SequenceChunk(f"s{i}", [0] * count, context - count, table, samples=True)
              for i, (table, context, count) in enumerate(zip(TABLES, CONTEXTS, new_tokens))]
    total = sum(new_tokens)
    q = torch.randn(total, HEADS, HEAD_DIM).to(dtype)
    k = torch.randn(total, KV_HEADS, HEAD_DIM).to(dtype)
    v = torch.randn(total, KV_HEADS, HEAD_DIM).to(dtype)
    batch = AttentionBatch.build(chunks, BLOCK_SIZE, torch.device("cpu"), window,
                                 token_by_token=token_by_token)
    decodes = 4 if prefilling == 0 else 3
    assert len(batch.groups) == (1 if token_by_token
                                 else (1 if group_cost else decodes) + (prefilling > 0))
    out = paged_attention(q, k, v, k_cache, v_cache, batch, windowed=window is not None,
                          decode=decode)

    first = 0
    for chunk, context, count in zip(chunks, CONTEXTS, new_tokens):
        positions = torch.arange(context)
        context_slots = (torch.tensor(chunk.block_ids)[positions // BLOCK_SIZE] * BLOCK_SIZE
                         + positions % BLOCK_SIZE)
        rows = slice(first, first + count)
        assert torch.equal(k_cache[context_slots[-count:]], k[rows])
        expected = reference(q[rows], k_cache[context_slots], v_cache[context_slots], window)
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        assert torch.allclose(out[rows].float(), expected, atol=tolerance), chunk.request_id
        first += count


def test_decoding_sequences_are_grouped_by_context_where_padding_costs_more_than_a_group(
        ) -> None:
    long, short = [1000] * 3, [40] * 20
    groups = split_by_context(list(range(23)), long + short)
    assert sorted(map(sorted, groups)) == [[0, 1, 2], list(range(3, 23))]
    # Padding 20 contexts of 40 to 60 costs 400 slots, less than another group.
    assert split_by_context(list(range(21)), [60] + [40] * 20) == [list(range(21))]
    assert split_by_context([7, 8], [90, 90]) == [[7, 8]]


def test_groups_by_context_hold_each_sequence_once() -> None:
    contexts = [32 + (37 * i) % 193 for i in range(64)]
    rows = [100 + i for i in range(64)]
    groups = split_by_context(rows, contexts)
    assert sorted(row for group in groups for row in group) == rows
    assert len(groups) > 1
    padded = sum(len(group) * max(contexts[row - 100] for row in group) for group in groups)
    assert padded < 0.8 * 64 * max(contexts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_by_token_a_tokens_attention_is_the_same_bits_whatever_the_step_holds(
        dtype: torch.dtype) -> None:
    """Deterministic inference: a prompt's last 3 tokens computed in one chunk beside 3
    decoding sequences, or each alone as the prompt is computed a token a step."""
    torch.manual_seed(0)
    slots = (max(max(table) for table in TABLES) + 1) * BLOCK_SIZE
    k_cache = torch.randn(slots, KV_HEADS, HEAD_DIM).to(dtype)
    v_cache = torch.randn(slots, KV_HEADS, HEAD_DIM).to(dtype)
    q = torch.randn(6, HEADS, HEAD_DIM).to(dtype)
    k = torch.randn(6, KV_HEADS, HEAD_DIM).to(dtype)
    v = torch.randn(6, KV_HEADS, HEAD_DIM).to(dtype)
    chunks = [SequenceChunk(f"s{i}", [0] * count, context - count, table, samples=True)
              for i, (table, context, count) in enumerate(zip(TABLES, CONTEXTS, [3, 1, 1, 1]))]

    def attend(step: list[SequenceChunk], rows: slice) -> torch.Tensor:
        batch = AttentionBatch.build(step, BLOCK_SIZE, torch.device("cpu"), token_by_token=True)
        return paged_attention(q[rows], k[rows], v[rows], k_cache, v_cache, batch,
                               decode=DecodeAttention.NATIVE)

    together = attend(chunks, slice(0, 6))[:3]
    first = chunks[0]
    alone = torch.cat([attend([SequenceChunk("s0", [0], first.start + i, first.block_ids,
                                             samples=True)], slice(i, i + 1))
                       for i in range(3)])
    assert torch.equal(together, alone)
