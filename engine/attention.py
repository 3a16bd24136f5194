"""Attention over the paged KV cache for a whole batch.

The batch's tokens arrive flat ([tokens, heads, head_dim]); each sequence's new K/V are
written into its blocks' slots, then each sequence's context is gathered from the cache into
a padded [sequences, context] layout and attended with `scaled_dot_product_attention` under
a causal-and-padding mask. Decoding sequences (one query each) and prefilling ones (a chunk
of queries each) form separate groups, one SDPA call each: padding 64 one-token decodes to a
64-token prefill chunk would multiply the work by 64. On a CPU decoding sequences are split
further by context length (`split_by_context`), which shortens attention where contexts vary,
and may attend through the native kernel instead (`DecodeAttention.NATIVE`), which reads the
context from the cache by its slots without the padded copy. The pure-torch path runs on
any device; on CUDA, SDPA picks its fused kernels, except cuDNN's in eager steps: it builds a
plan for each new shape, and eager shapes rarely repeat, so it slowed prefills of new lengths
(docs/engine-measurements.md#attention). The fixed shapes of the CUDA graphs that replay
decode steps keep it: their plans are built once, at capture.

Layers with sliding-window attention (Mistral's, Qwen2's upper layers) attend to the last
`sliding_window` positions only, as transformers' `kv > q - sliding_window`: their groups carry
a second mask (the native kernel reads the window alone). Gathered, the whole context is
copied; the window only masks it.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from switchboard.engine import native

if TYPE_CHECKING:
    from switchboard.engine.paged_runner import SequenceChunk

EAGER_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# What one more group of decoding sequences costs a layer, in the context slots that cost as
# much to gather and attend (see `split_by_context`), an estimate from timing whole groups
# (docs/engine-measurements.md#attention).
GROUP_COST_SLOTS = 512


@dataclass(frozen=True, slots=True)
class AttentionGroup:
    """Sequences attended together: same padded query length."""

    token_index: torch.Tensor    # [Tg] flat index of each of the group's tokens
    query_index: torch.Tensor    # [B, Qmax] flat index of each sequence's queries (padded)
    context_slots: torch.Tensor  # [B, Lmax] cache slots of each sequence's context (padded)
    mask: torch.Tensor | None    # [B, 1, Qmax, Lmax] True where a query may attend; None:
                                 # everywhere (decoding sequences of one length, as one alone)
    unpad_index: torch.Tensor    # [Tg] position of each group token in the padded [B*Qmax]
    window_mask: torch.Tensor | None  # `mask` within the sliding window (`mask` itself where
                                      # no query reaches past the window)
    context_lens: torch.Tensor   # [B] each sequence's context, this step's tokens included

    @classmethod
    def build(cls, rows: np.ndarray, firsts: np.ndarray, starts: np.ndarray,
              q_lens: np.ndarray, block_table: np.ndarray, block_size: int,
              device: torch.device, sliding_window: int | None = None) -> AttentionGroup:
        """The group of a batch's sequences at `rows` (see `AttentionBatch.build`), given
        every sequence's first token's flat index, first position, number of tokens and
        blocks (block_table, padded with block 0)."""
        firsts, starts, q_lens = firsts[rows], starts[rows], q_lens[rows]
        context_lens = starts + q_lens
        q_max, l_max = int(q_lens.max()), int(context_lens.max())
        key_positions = np.arange(l_max).reshape(1, -1)
        context_slots = slot_table(block_table[rows], key_positions, block_size)
        offsets = np.arange(q_max).reshape(1, -1)
        query_positions = (starts.reshape(-1, 1) + offsets)[..., None]  # [B, Qmax, 1]
        if q_max == 1:  # decoding sequences: no padded queries
            token_index, query_index = firsts, firsts.reshape(-1, 1)
            unpad_index = np.arange(len(rows))
            causal, padding = key_positions <= query_positions, None
        else:
            valid_query = offsets < q_lens.reshape(-1, 1)
            padded_index = firsts.reshape(-1, 1) + offsets
            token_index = padded_index[valid_query]
            unpad_index = (np.arange(len(rows)).reshape(-1, 1) * q_max + offsets)[valid_query]
            query_index = np.where(valid_query, padded_index, 0)
            causal = (key_positions <= query_positions) & valid_query[..., None]
            # Padded query rows attend to slot 0 only, so no row of the softmax is empty.
            padding = (key_positions == 0) & ~valid_query[..., None]
        mask = window_mask = None
        if q_max > 1 or context_lens.min() < l_max:
            context_slots[key_positions >= context_lens.reshape(-1, 1)] = 0
            mask = window_mask = _to(_allowed(causal, padding)[:, None], device)
        if sliding_window is not None and l_max > sliding_window:
            in_window = within_window(key_positions, query_positions, sliding_window)
            window_mask = _to(_allowed(causal & in_window, padding)[:, None], device)
        return cls(
            token_index=_to(token_index, device),
            query_index=_to(query_index, device),
            context_slots=_to(context_slots, device),
            mask=mask,
            unpad_index=_to(unpad_index, device),
            window_mask=window_mask,
            context_lens=_to(context_lens, device),
        )

    @property
    def is_decode(self) -> bool:
        return self.query_index.shape[1] == 1


@dataclass(frozen=True, slots=True)
class AttentionBatch:
    """Index tensors shared by every layer of one step."""

    token_ids: torch.Tensor      # [T] flat tokens of all chunks
    positions: torch.Tensor      # [T]
    write_slots: torch.Tensor    # [T] cache slot of each new token
    groups: tuple[AttentionGroup, ...]
    sample_index: torch.Tensor   # [S] flat index of each token whose logits are returned
    fixed_shape: bool = False    # a CUDA graph's batch: its shapes never change
    sliding_window: int | None = None  # that of the model's sliding-window layers

    @classmethod
    def build(cls, chunks: Sequence[SequenceChunk], block_size: int, device: torch.device,
              sliding_window: int | None = None, *, token_by_token: bool = False
              ) -> AttentionBatch:
        """The step's index tensors, computed as numpy arrays with a few operations for the
        whole batch and each group rather than some for each sequence, whose cost would grow
        with the batch; numpy's operations on arrays this small cost a fraction of torch's
        (docs/engine-measurements.md#attention).

        token_by_token: every token attends as a decoding sequence of its own at its
        position, in one group, for deterministic inference: SDPA computes a query's row
        otherwise with the chunk it came in, the padding its group needed and whether a mask
        is given, where the native kernel computes each row alone."""
        num_chunks = len(chunks)
        q_lens = np.fromiter((len(chunk.token_ids) for chunk in chunks), np.int64, num_chunks)
        starts = np.fromiter((chunk.start for chunk in chunks), np.int64, num_chunks)
        num_logits = np.fromiter((chunk.num_logits for chunk in chunks), np.int64, num_chunks)
        ends = np.cumsum(q_lens)
        firsts, num_tokens = ends - q_lens, int(ends[-1])
        if num_tokens == num_chunks:  # decoding sequences only: one token each
            sequence_of_token, positions = np.arange(num_chunks), starts
        else:
            sequence_of_token = np.repeat(np.arange(num_chunks), q_lens)
            positions = starts[sequence_of_token] + np.arange(num_tokens) \
                - firsts[sequence_of_token]
        block_table = padded_block_table([chunk.block_ids for chunk in chunks],
                                         max(len(chunk.block_ids) for chunk in chunks))
        write_slots = slot_table(block_table[sequence_of_token], positions.reshape(-1, 1),
                                 block_size)
        if token_by_token:
            tokens = np.arange(num_tokens)
            groups = (AttentionGroup.build(tokens, tokens, positions, np.ones_like(tokens),
                                           block_table[sequence_of_token], block_size, device,
                                           sliding_window),)
        else:
            decodes, prefills = np.flatnonzero(q_lens == 1), np.flatnonzero(q_lens > 1)
            decode_groups = (split_by_context(decodes.tolist(), starts[decodes] + 1)
                             if device.type == "cpu" else [decodes])
            groups = tuple(
                AttentionGroup.build(np.asarray(rows), firsts, starts, q_lens, block_table,
                                     block_size, device, sliding_window)
                for rows in (*decode_groups, prefills) if len(rows))
        token_ids = np.fromiter(itertools.chain.from_iterable(
            chunk.token_ids for chunk in chunks), np.int64, num_tokens)
        return cls(
            token_ids=_to(token_ids, device),
            positions=_to(positions, device),
            write_slots=_to(write_slots.reshape(-1), device),
            groups=groups,
            sample_index=_to(_sampled_tokens(ends, num_logits), device),
            sliding_window=sliding_window,
        )


def _sampled_tokens(ends: np.ndarray, num_logits: np.ndarray) -> np.ndarray:
    """The flat index of each token whose logits are returned: each chunk's last
    num_logits tokens, which end at its `ends`."""
    if (num_logits == 1).all():
        return ends - 1
    firsts = np.repeat(ends - num_logits, num_logits)
    counted = np.cumsum(num_logits)
    return firsts + np.arange(int(counted[-1])) - np.repeat(counted - num_logits, num_logits)


def _to(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(device)


def _allowed(causal: torch.Tensor, padding: torch.Tensor | None) -> torch.Tensor:
    return causal if padding is None else causal | padding


def split_by_context(rows: Sequence[int], contexts: Sequence[int]) -> list[list[int]]:
    """Decoding sequences (`rows`, whose contexts are `contexts` tokens long) in groups of
    similar contexts. A group gathers and attends every sequence's context padded to its
    longest, so one group of contexts from 32 to 224 tokens does nearly twice the work its
    sequences need; each group costs a few calls of its own a layer, as much as about
    GROUP_COST_SLOTS more slots. Sorted by context, a group is split where the padding that
    saves outweighs that (at the latest of equal savings), and so are its parts. Each group
    keeps its rows in their order."""
    rows = np.asarray(rows)
    order = np.argsort(-np.asarray(contexts), kind="stable")
    longest = np.asarray(contexts)[order]
    groups: list[list[int]] = []
    pending = [(0, len(order))]
    while pending:
        start, end = pending.pop()
        cuts = np.arange(end - 1, start, -1)  # latest first: argmax takes the first maximum
        savings = (end - cuts) * (longest[start] - longest[cuts]) if len(cuts) else cuts
        if len(cuts) and savings.max() > GROUP_COST_SLOTS:
            cut = int(cuts[savings.argmax()])
            pending.extend(((cut, end), (start, cut)))
        else:
            groups.append(rows[np.sort(order[start:end])].tolist())
    return groups


def within_window(key_positions: np.ndarray, query_positions: np.ndarray,
                  sliding_window: int) -> np.ndarray:
    """Where a query may see a key under a sliding window (transformers' rule)."""
    return key_positions > query_positions - sliding_window


def padded_block_table(tables: Sequence[Sequence[int]], width: int) -> np.ndarray:
    """Sequences' block tables as the rows of one array [sequences, width], each cut to
    `width` blocks or padded with block 0."""
    lengths = np.fromiter(map(len, tables), np.int64, len(tables))
    if lengths.max(initial=0) > width:
        tables = [table[:width] for table in tables]
        lengths = np.minimum(lengths, width)
    padded = np.zeros((len(tables), width), dtype=np.int64)
    padded[np.arange(width) < lengths.reshape(-1, 1)] = np.fromiter(
        itertools.chain.from_iterable(tables), np.int64, int(lengths.sum()))
    return padded


def slot_table(block_table: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """Cache slots at `positions` [B, L] (or [1, L], the same for every row) of the sequences
    whose blocks are the rows of `block_table` [B, blocks]."""
    blocks = block_table[np.arange(len(block_table)).reshape(-1, 1), positions // block_size]
    return blocks * block_size + positions % block_size


class DecodeAttention(enum.Enum):
    """How decoding sequences (one query each) attend; on a CPU the warm-up times the forms
    and keeps the fastest (see `PagedRunner._measure_decode_attention`;
    docs/engine-measurements.md#decoding-attention)."""

    SDPA = "SDPA's GQA"
    GROUPED = "grouped by K/V head"  # see `_attend_grouped`
    NATIVE = "native kernel"         # engine/csrc/decode_attention.cpp, where it was built


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, batch: AttentionBatch, *, windowed: bool = False,
                    decode: DecodeAttention = DecodeAttention.SDPA) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D], in the caches' dtype; caches [slots, Hkv, D]. Returns
    [T, H*D]. windowed: the layer attends within the batch's sliding window; decode: how
    decoding sequences attend."""
    k_cache.index_copy_(0, batch.write_slots, k)
    v_cache.index_copy_(0, batch.write_slots, v)
    return attend_cached(q, k_cache, v_cache, batch, windowed=windowed, decode=decode)


def attend_cached(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  batch: AttentionBatch, *, windowed: bool = False,
                  decode: DecodeAttention = DecodeAttention.SDPA) -> torch.Tensor:
    """`paged_attention` once the batch's new K/V are in the caches."""
    window = batch.sliding_window if windowed else None
    if len(batch.groups) == 1 and batch.groups[0].is_decode:
        return _attend(q.unsqueeze(1), k_cache, v_cache, batch.groups[0], batch.fixed_shape,
                       window, decode)
    out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
    for group in batch.groups:
        queries = q[group.query_index]
        attended = _attend(queries, k_cache, v_cache, group, batch.fixed_shape, window, decode)
        out.index_copy_(0, group.token_index, attended[group.unpad_index])
    return out


def _attend(queries: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            group: AttentionGroup, fixed_shape: bool, window: int | None,
            decode: DecodeAttention) -> torch.Tensor:
    """queries [B, Qmax, H, D] → [B*Qmax, H*D]; window: the layer's sliding window."""
    batch, q_len, heads, head_dim = queries.shape
    if q_len == 1 and decode is DecodeAttention.NATIVE:
        return _attend_natively(queries[:, 0], k_cache, v_cache, group, window)
    keys = _gather(k_cache, group.context_slots)      # [B, Hkv, Lmax, D]
    values = _gather(v_cache, group.context_slots)
    mask = group.mask if window is None else group.window_mask
    if q_len == 1 and decode is DecodeAttention.GROUPED:
        return _attend_grouped(queries, keys, values, mask).reshape(batch, heads * head_dim)
    # Only CUDA has cuDNN's kernel to avoid; on a CPU the context would cost time every layer.
    restricts = not fixed_shape and queries.device.type == "cuda"
    with sdpa_kernel(EAGER_BACKENDS) if restricts else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(queries.transpose(1, 2), keys, values,
                                             attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2).reshape(-1, heads * head_dim)


def _attend_grouped(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    mask: torch.Tensor | None) -> torch.Tensor:
    """One query per sequence, [B, 1, H, D]: the H // Hkv query heads that share a K/V head
    attend as that head's rows ([B, Hkv, H // Hkv, D]), one pass over each K/V head instead of
    one per query head."""
    batch, _, heads, head_dim = queries.shape
    kv_heads = keys.shape[1]
    grouped = queries.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    return F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask)


def _attend_natively(queries: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     group: AttentionGroup, window: int | None) -> torch.Tensor:
    """queries [B, H, D] of decoding sequences → [B, H*D], read straight from the caches by
    the group's context slots: no padded copy of the context, no mask."""
    return native.kernels().decode_attention(queries, k_cache, v_cache, group.context_slots,
                                             group.context_lens, window or 0,
                                             queries.shape[-1] ** -0.5)


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """cache [slots, Hkv, D] at slots [B, L] → [B, Hkv, L, D]. index_select on the flat slots:
    on CPU it copies rows faster than advanced indexing with a 2-D index
    (docs/engine-measurements.md#attention)."""
    rows = cache.index_select(0, slots.view(-1))
    return rows.view(*slots.shape, *cache.shape[1:]).transpose(1, 2)
