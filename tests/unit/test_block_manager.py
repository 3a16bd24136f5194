"""engine.block_manager.BlockManager: the block pool, block tables and automatic prefix caching."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from switchboard.engine.block_manager import BlockManager, BlockTable

BLOCK_SIZE = 4


def computed_table(manager: BlockManager, token_ids: list[int]) -> BlockTable:
    """A table that got blocks for token_ids and computed them all, as the core does."""
    table = BlockTable()
    assert manager.allocate(table, len(token_ids))
    manager.commit(table, token_ids, len(token_ids))
    return table


def reused(manager: BlockManager, token_ids: list[int]) -> tuple[BlockTable, int]:
    table = BlockTable()
    return table, manager.reuse_prefix(table, token_ids)


def ref_count(manager: BlockManager, block_id: int) -> int:
    return manager._blocks[block_id].ref_count


@pytest.mark.parametrize(("num_tokens", "num_blocks"), [
    (0, 0), (1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (9, 3), (32, 8),
])
def test_allocate_gives_ceil_tokens_over_block_size_blocks(num_tokens: int,
                                                           num_blocks: int) -> None:
    manager = BlockManager(8, BLOCK_SIZE)
    table = BlockTable()
    assert manager.allocate(table, num_tokens)
    assert len(table.block_ids) == len(set(table.block_ids)) == num_blocks
    assert manager.num_free_blocks == 8 - num_blocks


def test_allocate_grows_a_table_keeping_its_blocks_and_never_shrinks_it() -> None:
    manager = BlockManager(8, BLOCK_SIZE)
    table = BlockTable()
    assert manager.allocate(table, 3)
    first = list(table.block_ids)
    assert manager.blocks_needed(table, 9) == 2
    assert manager.allocate(table, 9)
    assert table.block_ids[:1] == first and len(table.block_ids) == 3
    assert manager.blocks_needed(table, 2) == 0
    assert manager.allocate(table, 2)
    assert len(table.block_ids) == 3
    assert manager.num_free_blocks == 5


def test_allocate_fails_without_change_when_the_pool_is_short() -> None:
    manager = BlockManager(3, BLOCK_SIZE)
    other, table = BlockTable(), BlockTable()
    assert manager.allocate(other, 4)
    assert manager.allocate(table, 4)
    assert not manager.allocate(table, 13)  # needs 3 more blocks; 1 is free
    assert len(table.block_ids) == 1
    assert manager.num_free_blocks == 1
    assert manager.allocate(table, 8)  # the one free block is still there
    assert manager.num_free_blocks == 0


def test_free_returns_every_block_and_empties_the_table() -> None:
    manager = BlockManager(6, BLOCK_SIZE)
    first = computed_table(manager, list(range(10)))
    second = BlockTable()
    assert manager.allocate(second, 7)
    manager.free(first)
    assert (first.block_ids, first.hashes) == ([], [])
    assert manager.num_free_blocks == 4
    manager.free(second)
    manager.free(second)  # freeing an empty table changes nothing
    assert manager.num_free_blocks == 6


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 4), (4, 0), (-1, 1)])
def test_an_empty_pool_or_empty_blocks_are_rejected(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError, match="at least one block"):
        BlockManager(num_blocks, block_size)


@pytest.mark.parametrize(("prompt_length", "num_cached_tokens"), [
    (3, 0),    # no full block
    (4, 0),    # one full block, but its last token must be computed for the next logits
    (5, 4),
    (8, 4),    # exactly two full blocks: only the first is reused
    (9, 8),
    (12, 8),
    (13, 12),
    (20, 12),  # only three blocks were cached
])
def test_reuse_prefix_takes_the_cached_full_blocks_and_leaves_a_token_to_compute(
        prompt_length: int, num_cached_tokens: int) -> None:
    manager = BlockManager(16, BLOCK_SIZE)
    tokens = list(range(20))
    first = computed_table(manager, tokens[:13])
    table, cached = reused(manager, tokens[:prompt_length])
    assert cached == num_cached_tokens
    assert cached % BLOCK_SIZE == 0 and cached < prompt_length
    num_reused = cached // BLOCK_SIZE
    assert table.block_ids == first.block_ids[:num_reused]
    assert table.hashes == first.hashes[:num_reused]


def test_commit_registers_only_blocks_filled_by_computed_tokens() -> None:
    manager = BlockManager(8, BLOCK_SIZE)
    tokens = list(range(12))
    table = BlockTable()
    assert manager.allocate(table, 12)
    manager.commit(table, tokens, 6)
    assert len(table.hashes) == 1
    assert reused(manager, tokens + [0])[1] == 4
    manager.commit(table, tokens, 12)
    assert len(table.hashes) == 3
    assert reused(manager, tokens + [0])[1] == 12


def test_reuse_prefix_gives_nothing_to_a_table_that_has_blocks() -> None:
    manager = BlockManager(8, BLOCK_SIZE)
    tokens = list(range(9))
    computed_table(manager, tokens)
    table = BlockTable()
    assert manager.allocate(table, 1)
    assert manager.reuse_prefix(table, tokens) == 0
    assert len(table.block_ids) == 1


def test_shared_prefix_blocks_are_reference_counted() -> None:
    manager = BlockManager(8, BLOCK_SIZE)
    tokens = list(range(9))
    first = computed_table(manager, tokens)           # 3 blocks
    second, cached = reused(manager, tokens)          # shares 2 of them
    assert cached == 8
    assert manager.allocate(second, 9)                # its own third block
    shared = first.block_ids[:2]
    assert [ref_count(manager, block_id) for block_id in shared] == [2, 2]
    assert second.block_ids[2] != first.block_ids[2]
    assert manager.num_free_blocks == 8 - 4
    manager.free(first)
    assert [ref_count(manager, block_id) for block_id in shared] == [1, 1]
    assert manager.num_free_blocks == 8 - 3           # only first's private block came back
    manager.free(second)
    assert manager.num_free_blocks == 8


def test_freed_cached_blocks_stay_reusable_until_the_pool_needs_them() -> None:
    manager = BlockManager(4, BLOCK_SIZE)
    tokens = list(range(16))
    first = computed_table(manager, tokens)
    block_ids = list(first.block_ids)
    manager.free(first)
    assert manager.num_free_blocks == 4
    again, cached = reused(manager, tokens + [0])
    assert cached == 16
    assert again.block_ids == block_ids
    assert manager.num_free_blocks == 0


def test_allocate_evicts_the_least_recently_freed_block_and_it_is_no_longer_reused() -> None:
    manager = BlockManager(4, BLOCK_SIZE)
    tokens = list(range(16))
    first = computed_table(manager, tokens)
    head, tail = first.block_ids[:3], first.block_ids[3]
    manager.free(first)  # the tail block is freed first, so it is evicted first
    newcomer = BlockTable()
    assert manager.allocate(newcomer, 1)
    assert newcomer.block_ids == [tail]
    table, cached = reused(manager, tokens + [0])
    assert cached == 12
    assert table.block_ids == head


def test_the_prefix_freed_longest_ago_is_evicted_first() -> None:
    manager = BlockManager(4, BLOCK_SIZE)
    old, recent = [1] * 8, [2] * 8
    old_table, recent_table = computed_table(manager, old), computed_table(manager, recent)
    manager.free(old_table)
    manager.free(recent_table)
    newcomer = BlockTable()
    assert manager.allocate(newcomer, 8)
    assert reused(manager, old + [0])[1] == 0
    assert reused(manager, recent + [0])[1] == 8


def test_a_block_matches_only_after_the_same_prefix() -> None:
    manager = BlockManager(16, BLOCK_SIZE)
    first, second, third = [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]
    computed_table(manager, first + second + third)
    assert reused(manager, [9, 9, 9, 9] + second + third + [0])[1] == 0
    assert reused(manager, first + [9, 9, 9, 9] + third + [0])[1] == 4
    assert reused(manager, first + second + [9, 9, 9, 9] + [0])[1] == 8
    assert reused(manager, second + first + third + [0])[1] == 0


def test_disabled_prefix_caching_never_reuses() -> None:
    manager = BlockManager(8, BLOCK_SIZE, enable_prefix_caching=False)
    tokens = list(range(9))
    first = computed_table(manager, tokens)
    assert first.hashes == []
    assert reused(manager, tokens)[1] == 0
    manager.free(first)
    table, cached = reused(manager, tokens)
    assert (cached, table.block_ids) == (0, [])
    assert manager.num_free_blocks == 8


# Property: any sequence of operations keeps the pool's books balanced, and a reused block
# always holds the tokens it was reused for. Prompts are cuts of one shared base plus their
# own 0/1 tails, with blocks of 2 tokens, so prefixes collide often.

PROPERTY_BLOCK_SIZE = 2
NUM_TABLES = 3

tables_of = st.integers(0, NUM_TABLES - 1)
operations = st.lists(st.one_of(
    st.tuples(st.just("allocate"), tables_of, st.integers(1, 14)),
    st.tuples(st.just("commit"), tables_of, st.integers(0, 14)),
    st.tuples(st.just("reuse"), tables_of, st.just(0)),
    st.tuples(st.just("free"), tables_of, st.just(0)),
), min_size=5, max_size=60)
prompt_shapes = st.lists(st.tuples(st.integers(0, 10), st.lists(st.integers(0, 1), max_size=4)),
                         min_size=NUM_TABLES, max_size=NUM_TABLES)


@settings(max_examples=300, deadline=None)
@given(num_blocks=st.integers(1, 10), base=st.lists(st.integers(0, 1), min_size=10, max_size=10),
       shapes=prompt_shapes, steps=operations)
def test_block_accounting_holds_after_any_sequence_of_operations(
        num_blocks: int, base: list[int], shapes: list[tuple[int, list[int]]],
        steps: list[tuple[str, int, int]]) -> None:
    prompts = [base[:cut] + tail or [0] for cut, tail in shapes]
    manager = BlockManager(num_blocks, PROPERTY_BLOCK_SIZE)
    tables = [BlockTable() for _ in range(NUM_TABLES)]
    kv_cache: dict[int, int] = {}  # slot -> the token computed into it

    def slot(table: BlockTable, position: int) -> int:
        return table.block_ids[position // PROPERTY_BLOCK_SIZE] * PROPERTY_BLOCK_SIZE \
            + position % PROPERTY_BLOCK_SIZE

    def reuse(table: BlockTable, tokens: list[int]) -> None:
        had_blocks = bool(table.block_ids)
        cached = manager.reuse_prefix(table, tokens)
        assert cached % PROPERTY_BLOCK_SIZE == 0
        if had_blocks:
            assert cached == 0
        else:
            assert len(table.block_ids) * PROPERTY_BLOCK_SIZE == cached
            assert cached == 0 or cached < len(tokens)
            assert [kv_cache.get(slot(table, p)) for p in range(cached)] == tokens[:cached]

    for operation, index, amount in steps:
        table, tokens = tables[index], prompts[index]
        if operation == "allocate":  # as the scheduler admits: an empty table tries the cache
            if not table.block_ids:
                reuse(table, tokens)
            num_tokens = min(amount, len(tokens))
            before, free_before = list(table.block_ids), manager.num_free_blocks
            needed = manager.blocks_needed(table, num_tokens)
            granted = manager.allocate(table, num_tokens)
            assert granted == (needed <= free_before)
            if granted:
                assert table.block_ids[:len(before)] == before
                for block_id in table.block_ids[len(before):]:
                    for offset in range(PROPERTY_BLOCK_SIZE):  # new content will overwrite it
                        kv_cache.pop(block_id * PROPERTY_BLOCK_SIZE + offset, None)
            else:
                assert (table.block_ids, manager.num_free_blocks) == (before, free_before)
        elif operation == "commit":
            num_computed = min(amount, len(tokens), len(table.block_ids) * PROPERTY_BLOCK_SIZE)
            for position in range(num_computed):
                kv_cache[slot(table, position)] = tokens[position]
            manager.commit(table, tokens, num_computed)
        elif operation == "reuse":
            reuse(table, tokens)
        else:
            manager.free(table)
            assert table.block_ids == []

        assert all(len(set(held.block_ids)) == len(held.block_ids) for held in tables)
        holders = Counter(block_id for held in tables for block_id in held.block_ids)
        assert manager.num_free_blocks + len(holders) == num_blocks
        for block_id in range(num_blocks):
            assert ref_count(manager, block_id) == holders[block_id]
        for block_id, count in holders.items():
            if count > 1:
                digest = manager._blocks[block_id].content_hash
                assert digest is not None and manager._cached[digest] == block_id
