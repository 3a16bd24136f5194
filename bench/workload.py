"""The fixed, seeded workload: unique prompts of mixed lengths made of realistic token ids."""

from __future__ import annotations

import random
from collections.abc import Sequence

# Tokenized with the model's tokenizer, it gives the pool prompts are drawn from: ids of real
# English text, in the range a real prompt uses.
PARAGRAPH = (
    "The harbour town woke slowly on winter mornings. Fishing boats came back before dawn, "
    "their decks crowded with nets and crates of silver fish, and the gulls followed them in "
    "wide, noisy circles. By seven the bakery on the corner had opened its shutters, and the "
    "smell of fresh bread drifted down to the quay, where the harbour master checked the tide "
    "tables and wrote the day's arrivals on a small chalkboard. Children walked to school "
    "along the sea wall, stopping to watch the waves break against the old stone steps. In "
    "the library, a retired teacher was cataloguing letters written by sailors more than a "
    "century ago: requests for news from home, complaints about the food, careful sketches of "
    "distant coastlines and strange animals. Many of the letters had never been delivered. "
    "She read each one twice, copied the date and the name of the ship into a ledger, and "
    "wondered what had happened to the people who wrote them. In the afternoon the wind "
    "usually turned, bringing rain from the west, and the market traders packed their stalls "
    "away early. Evenings were quiet, lit by the yellow windows of the pub and the slow "
    "sweep of the lighthouse beam across the water, and the town went to sleep listening to "
    "the engines of the boats getting ready to leave again."
)


class PromptSource:
    """Seeded prompts: each a fresh shuffle of `pool` cut to a length drawn uniformly from
    [min_len, max_len]. No two prompts it gives are equal, so a prefix cache cannot flatter
    the figures."""

    def __init__(self, pool: Sequence[int], seed: int, min_len: int, max_len: int) -> None:
        if not 1 <= min_len <= max_len <= len(pool):
            raise ValueError(f"prompt lengths [{min_len}, {max_len}] must lie within "
                             f"[1, {len(pool)}] (the paragraph's tokens)")
        self._pool = list(pool)
        self._rng = random.Random(seed)
        self._min_len = min_len
        self._max_len = max_len
        self._seen: set[tuple[int, ...]] = set()

    def draw(self, count: int) -> list[tuple[int, ...]]:
        return [self._draw_one() for _ in range(count)]

    def draw_like(self, prompts: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Fresh prompts of the lengths of `prompts`: as much work, none of it cached."""
        return [self._draw_one(len(prompt)) for prompt in prompts]

    def _draw_one(self, length: int | None = None) -> tuple[int, ...]:
        while True:
            ids = self._pool.copy()
            self._rng.shuffle(ids)
            prompt = tuple(ids[:length or self._rng.randint(self._min_len, self._max_len)])
            if prompt not in self._seen:
                self._seen.add(prompt)
                return prompt
