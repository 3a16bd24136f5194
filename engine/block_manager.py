"""The paged KV cache's bookkeeping: a fixed pool of blocks, per-request block tables, and
automatic prefix caching.

A full block is identified by a hash chained over every token up to its end, so two
requests whose prompts share a prefix share that prefix's blocks (reference counted). Freed
blocks keep their content and hash in an LRU list until the pool needs them again, so a
later request with the same prefix can still reuse them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    content_hash: int | None = None


@dataclass(slots=True)
class BlockTable:
    """A request's blocks, in order, and the hashes of its leading full blocks."""

    block_ids: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)


def chain_hash(previous: int | None, token_ids: Sequence[int]) -> int:
    return hash((previous, tuple(token_ids)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True
                 ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the KV cache needs at least one block of at least one token")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._prefix_caching = enable_prefix_caching
        self._blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_needed(self, table: BlockTable, num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - len(table.block_ids))

    def reuse_prefix(self, table: BlockTable, token_ids: Sequence[int]) -> int:
        """Give an empty table the cached blocks of the longest full-block prefix of
        `token_ids`; return the number of tokens they hold. At least one token is always left
        to compute, since the step that computes it yields the next token's logits."""
        if not self._prefix_caching or table.block_ids:
            return 0
        previous: int | None = None
        for start in range(0, len(token_ids) - 1 - self.block_size + 1, self.block_size):
            digest = chain_hash(previous, token_ids[start:start + self.block_size])
            block_id = self._cached.get(digest)
            if block_id is None:
                break
            self._take(block_id)
            table.block_ids.append(block_id)
            table.hashes.append(digest)
            previous = digest
        return len(table.block_ids) * self.block_size

    def allocate(self, table: BlockTable, num_tokens: int) -> bool:
        """Grow the table to hold num_tokens; False (and no change) if the pool is short."""
        needed = self.blocks_needed(table, num_tokens)
        if needed > len(self._free):
            return False
        for _ in range(needed):
            block_id = next(iter(self._free))
            block = self._blocks[block_id]
            if block.content_hash is not None:
                if self._cached.get(block.content_hash) == block_id:
                    del self._cached[block.content_hash]
                block.content_hash = None
            self._take(block_id)
            table.block_ids.append(block_id)
        return True

    def fills(self, table: BlockTable, num_computed_tokens: int) -> bool:
        """Computing up to num_computed_tokens has filled blocks still to `commit`."""
        return self._prefix_caching and self._num_full(table, num_computed_tokens) > len(
            table.hashes)

    def commit(self, table: BlockTable, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Register the blocks that computing up to num_computed_tokens has filled."""
        if not self._prefix_caching:
            return
        for index in range(len(table.hashes), self._num_full(table, num_computed_tokens)):
            previous = table.hashes[-1] if table.hashes else None
            start = index * self.block_size
            digest = chain_hash(previous, token_ids[start:start + self.block_size])
            table.hashes.append(digest)
            block = self._blocks[table.block_ids[index]]
            block.content_hash = digest
            self._cached.setdefault(digest, block.block_id)

    def _num_full(self, table: BlockTable, num_computed_tokens: int) -> int:
        return min(num_computed_tokens // self.block_size, len(table.block_ids))

    def free(self, table: BlockTable) -> None:
        """Release a table's blocks. Tail blocks go first into the LRU list, so a prompt's
        shared head outlives its private tail."""
        for block_id in reversed(table.block_ids):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
        table.block_ids.clear()
        table.hashes.clear()

    def _take(self, block_id: int) -> None:
        block = self._blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1
