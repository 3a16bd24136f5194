"""Decode steps replayed from CUDA graphs.

A decode step (one new token for each sequence) of a small model is bound by launching its
kernels, not by running them: an eager step spends many times longer on the host issuing
its kernels than the GPU spends running them
(docs/engine-measurements.md#cuda-graphs-and-speculation-on-the-h100). A CUDA graph launches
them all at once.

A graph fixes its tensors' shapes and addresses, so steps are padded to a bucket: the batch
to the next of `batch_buckets(...)`, each sequence's context to the next power of two (at
least MIN_CONTEXT_BUCKET, at most the longest sequence). Padding rows and padding context
point at a scratch slot past the real KV pool, masked out; a padding row's K/V is written
there. One graph per (batch bucket, context bucket): every batch bucket at the shortest
context is captured at start (`capture_common`), a longer context's the first time a step
needs it. All share one memory pool (replays never overlap) and write their logits into one
buffer. Steps that are not pure decodes, or larger than the largest bucket, run eagerly.

With `capture=False` the padded static batch is run without a graph: the same padding on any
device, which tests compare with the eager path on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from switchboard.engine.attention import (AttentionBatch, AttentionGroup, padded_block_table,
                                         slot_table, within_window)

if TYPE_CHECKING:
    from switchboard.engine.paged_runner import SequenceChunk

MAX_GRAPH_BATCH = 128
MIN_CONTEXT_BUCKET = 256

Forward = Callable[[AttentionBatch], torch.Tensor]


def batch_buckets(max_batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every multiple of 8, up to min(max_batch_size, MAX_GRAPH_BATCH)."""
    largest = min(max_batch_size, MAX_GRAPH_BATCH)
    buckets = [size for size in (1, 2, 4) if size < largest]
    buckets.extend(range(8, largest, 8))
    return (*buckets, largest)


def context_bucket(length: int, max_context: int) -> int:
    bucket = MIN_CONTEXT_BUCKET
    while bucket < length:
        bucket *= 2
    return min(bucket, max_context)


@dataclass(frozen=True, slots=True)
class _StaticStep:
    """One shape's input tensors (filled before each replay) and its graph."""

    batch: AttentionBatch
    graph: torch.cuda.CUDAGraph | None

    @classmethod
    def allocate(cls, batch_size: int, context: int, device: torch.device,
                 sliding_window: int | None) -> _StaticStep:
        """sliding_window: that of the model's sliding-window layers, which get a mask of their
        own (None: it has none)."""
        rows = torch.arange(batch_size, device=device)
        mask = torch.zeros(batch_size, 1, 1, context, dtype=torch.bool, device=device)
        group = AttentionGroup(
            token_index=rows, query_index=rows.view(-1, 1),
            context_slots=torch.zeros(batch_size, context, dtype=torch.long, device=device),
            mask=mask, unpad_index=rows,
            window_mask=mask if sliding_window is None else torch.zeros_like(mask),
            context_lens=torch.ones(batch_size, dtype=torch.long, device=device))
        batch = AttentionBatch(
            token_ids=torch.zeros(batch_size, dtype=torch.long, device=device),
            positions=torch.zeros(batch_size, dtype=torch.long, device=device),
            write_slots=torch.zeros(batch_size, dtype=torch.long, device=device),
            groups=(group,), sample_index=rows, fixed_shape=True,
            sliding_window=sliding_window)
        return cls(batch=batch, graph=None)


class DecodeGraphs:
    def __init__(self, forward: Forward, *, device: torch.device, block_size: int,
                 scratch_slot: int, max_batch_size: int, max_context: int,
                 capture: bool = True, sliding_window: int | None = None) -> None:
        """forward: the model step over an AttentionBatch, returning logits for its
        sample_index rows, with no host synchronisation. scratch_slot: a cache slot no
        sequence owns. sliding_window: that of the model's sliding-window layers."""
        self._forward = forward
        self._device = device
        self._block_size = block_size
        self._sliding_window = sliding_window
        self._scratch_slot = scratch_slot
        self._batch_buckets = batch_buckets(max_batch_size)
        self._max_context = max_context
        self._capture = capture
        self._steps: dict[tuple[int, int], _StaticStep] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        # One side stream for every capture's warm-up run: memory cached for a stream is
        # reused by that stream only, so a stream per capture would hold each run's memory.
        self._side_stream = torch.cuda.Stream(device) if capture else None
        self._logits: torch.Tensor | None = None  # [largest bucket, vocab]: every graph's output

    def capture_common(self) -> None:
        """Capture every batch bucket at the shortest context, so that serving does not pause
        to capture them (docs/engine-measurements.md#cuda-graphs-and-speculation-on-the-h100)."""
        shortest = context_bucket(1, self._max_context)
        for batch_size in self._batch_buckets:
            self._step(batch_size, shortest)

    def run(self, chunks: Sequence[SequenceChunk]) -> torch.Tensor | None:
        """The step's logits (float32, on the device; a copy, as the next replay overwrites
        the graphs' output), or None where it is not a decode step that a bucket holds (the
        caller runs it eagerly)."""
        if not chunks or len(chunks) > self._batch_buckets[-1] or not all(
                len(chunk.token_ids) == 1 and chunk.samples and not chunk.all_logits
                for chunk in chunks):
            return None
        longest = max(chunk.start for chunk in chunks) + 1
        if longest > self._max_context:
            return None
        batch_size = next(size for size in self._batch_buckets if size >= len(chunks))
        step = self._step(batch_size, context_bucket(longest, self._max_context))
        self._fill(step.batch, chunks)
        if step.graph is None:
            return self._forward(step.batch)[:len(chunks)].float()
        step.graph.replay()
        return self._logits[:len(chunks)].clone()

    def _step(self, batch_size: int, context: int) -> _StaticStep:
        step = self._steps.get((batch_size, context))
        if step is None:
            step = _StaticStep.allocate(batch_size, context, self._device,
                                        self._sliding_window)
            self._fill(step.batch, ())
            if self._capture:
                step = self._captured(step)
            self._steps[batch_size, context] = step
        return step

    def _captured(self, step: _StaticStep) -> _StaticStep:
        """Capture the step after one eager run on a side stream (as torch's docs ask: it
        lets lazily initialised state, such as cuBLAS workspaces, settle outside the
        graph). All rows are padding, so only the scratch slot is written."""
        side = self._side_stream
        side.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(side):
            logits = self._forward(step.batch)
        torch.cuda.current_stream(self._device).wait_stream(side)
        if self._logits is None:
            self._logits = torch.empty(self._batch_buckets[-1], logits.shape[-1],
                                       dtype=torch.float32, device=self._device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self._logits[:len(logits)].copy_(self._forward(step.batch))
        return _StaticStep(batch=step.batch, graph=graph)

    def _fill(self, batch: AttentionBatch, chunks: Sequence[SequenceChunk]) -> None:
        """Copy the chunks' tokens, positions and slots into the static tensors; rows past
        them are padding: token 0 at position 0, attending to the scratch slot alone."""
        group = batch.groups[0]
        batch_size, context = group.context_slots.shape
        rows, padding = len(chunks), batch_size - len(chunks)
        lengths = np.array([chunk.start + 1 for chunk in chunks] + [1] * padding)
        key_positions = np.arange(context).reshape(1, -1)
        mask = key_positions < lengths.reshape(-1, 1)
        slots = np.full((batch_size, context), self._scratch_slot, dtype=np.int64)
        if chunks:
            blocks = padded_block_table([chunk.block_ids for chunk in chunks],
                                        -(-context // self._block_size))
            slots[:rows] = np.where(mask[:rows], slot_table(blocks, key_positions,
                                                            self._block_size),
                                    self._scratch_slot)
        batch.token_ids.copy_(torch.tensor([chunk.token_ids[0] for chunk in chunks]
                                           + [0] * padding))
        batch.positions.copy_(torch.from_numpy(lengths - 1))
        batch.write_slots.copy_(torch.from_numpy(slots[np.arange(batch_size), lengths - 1]))
        group.context_slots.copy_(torch.from_numpy(slots))
        group.context_lens.copy_(torch.from_numpy(lengths))
        group.mask.copy_(torch.from_numpy(mask.reshape(batch_size, 1, 1, -1)))
        if self._sliding_window is not None:
            in_window = within_window(key_positions, lengths.reshape(-1, 1) - 1,
                                      self._sliding_window)
            group.window_mask.copy_(torch.from_numpy((mask & in_window)
                                                     .reshape(batch_size, 1, 1, -1)))
