"""N-gram speculation (prompt lookup decoding): guess a request's next tokens from its own
prompt and output, so one step can verify several tokens for the price of about one.

A decode step on a CPU reads every weight whatever its number of rows, so a step of a
sequence's newest token plus k guessed ones costs little more than a step of the newest
alone; each guess the model agrees with is a token gained. Guesses come from the latest
earlier occurrence of the sequence's last n tokens (n from NGRAM_MAX down to NGRAM_MIN):
the tokens that followed it then. Text that repeats itself (quotes of the prompt, code,
lists, a model looping) yields long runs of accepted guesses; other text yields few, and a
rejected guess costs its row in the step, so each request's `DraftWindow` shrinks its guesses
while they miss. The engine's sampler decides what is accepted (see `EngineCore`), so the
output is the one decoding token by token gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NGRAM_MAX = 3
NGRAM_MIN = 1
MAX_PAUSE_STEPS = 16


@dataclass(slots=True)
class DraftWindow:
    """How many guesses a request may have verified at its next step.

    After a verdict, one more than it accepted: agreement grows the window back to the most
    allowed, and a miss leaves one guess. Each miss also pauses guessing, for 1 step after a
    first miss, then 2, 4, ... up to MAX_PAUSE_STEPS while misses follow each other: on text
    that does not repeat, (sampled at a high temperature, say) guessing costs a row every
    MAX_PAUSE_STEPS steps or so, and a repetition that starts is found within as many.
    """

    size: int | None = None  # None: the most allowed
    misses: int = 0
    paused_steps: int = 0

    def next_size(self, most: int) -> int:
        """Guesses for this step (0: none), at most `most`; counts a paused step."""
        if self.paused_steps:
            self.paused_steps -= 1
            return 0
        return most if self.size is None else min(most, self.size)

    def record(self, accepted: int) -> None:
        """A step verified this request's guesses and accepted `accepted` of them."""
        self.size = accepted + 1
        self.misses = 0 if accepted else self.misses + 1
        self.paused_steps = min(MAX_PAUSE_STEPS, 2 ** (self.misses - 1)) if self.misses else 0


def propose_ngram(token_ids: Sequence[int], num_tokens: int) -> tuple[int, ...]:
    """Up to num_tokens guesses of what follows token_ids: the num_tokens that followed the
    latest earlier occurrence of its longest suffix (NGRAM_MAX down to NGRAM_MIN tokens) to
    occur followed by as many; failing that, the fewer that followed the latest occurrence of
    its longest repeated suffix (in a loop of one token, 'a a a' occurs once before, followed
    by one token, and 'a' many times, followed by many)."""
    if num_tokens < 1 or len(token_ids) < NGRAM_MIN + 1:
        return ()
    ids = np.asarray(token_ids)
    fewer: tuple[int, ...] = ()
    for n in range(min(NGRAM_MAX, len(ids) - 1), NGRAM_MIN - 1, -1):
        # Every window that starts early enough to be followed by at least one token.
        windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)
        ends = np.flatnonzero((windows == ids[-n:]).all(axis=1)) + n
        if ends.size == 0:
            continue
        followed_fully = ends[ends + num_tokens <= len(ids)]
        if followed_fully.size:
            return _tokens(ids[followed_fully[-1]:followed_fully[-1] + num_tokens])
        fewer = fewer or _tokens(ids[ends[-1]:])
    return fewer


def _tokens(ids: np.ndarray) -> tuple[int, ...]:
    return tuple(int(token) for token in ids)
