"""Prompts to tokens off the event loop: a prompt's size is checked before any work on it, then
its chat template and tokenizer run in a small pool of threads, with a bounded number of
prompts waiting for them. Tokenizing takes time and memory in proportion to the text, so an
unchecked prompt of tens of megabytes held the serving loop for seconds and its memory grew by
gigabytes; once checked, a prompt is at most `EngineLimits.max_prompt_bytes`."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from switchboard.engine.chat import ChatPrompt, render_chat
from switchboard.engine.config import EngineLimits
from switchboard.engine.errors import Overloaded
from switchboard.engine.validation import check_prompt_size

# Tokenizers release the GIL while they work: two threads keep one prompt from holding up
# the next without taking every core from the engine.
TOKENIZER_THREADS = 2
Result = TypeVar("Result")


@dataclass(frozen=True, slots=True)
class Tokenization:
    """A text's tokens: their ids, the characters [start, stop) each comes from ((0, 0) for a
    special token the tokenizer added), each one's text decoded alone (special tokens
    included: TGI's and OpenAI's token text) and each as the vocabulary spells it (vLLM's
    token_strs: byte-level BPE writes a space as "Ġ")."""

    ids: list[int]
    spans: list[tuple[int, int]]
    texts: list[str]
    vocabulary_strings: list[str]


def token_texts(tokenizer: object, token_ids: Sequence[int]) -> list[str]:
    """Each token decoded alone, special tokens included."""
    return tokenizer.batch_decode([[token_id] for token_id in token_ids])


class TokenTexts:
    """`token_texts`, each token decoded once: the serving loop asks for every generated
    token's text, and decoding releases the GIL, which the loop then waits to get back from
    the engine's thread."""

    def __init__(self, tokenizer: object) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token_ids: Sequence[int]) -> list[str]:
        missing = [token_id for token_id in dict.fromkeys(token_ids)
                   if token_id not in self._texts]
        if missing:
            self._texts.update(zip(missing, token_texts(self._tokenizer, missing)))
        return [self._texts[token_id] for token_id in token_ids]


class PromptTokenizer:
    """max_waiting: prompts taken at once, tokenizing or waiting their turn; one more is
    refused as Overloaded."""

    def __init__(self, tokenizer: object, limits: EngineLimits, max_waiting: int) -> None:
        self._tokenizer = tokenizer
        self._limits = limits
        self._max_waiting = max_waiting
        self._num_taken = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(TOKENIZER_THREADS,
                                                           thread_name_prefix="tokenizer")

    async def encode(self, text: str) -> list[int]:
        """A plain prompt's ids, special tokens added."""
        check_prompt_size("prompt", [text], self._limits)
        return await self._run(self._ids, text, True)

    async def render_chat(self, prompt: ChatPrompt) -> str:
        """The conversation as the chat template writes it (see `chat.py`); its messages are
        checked before the template runs, and what it wrote after."""
        check_prompt_size("messages", (message.content for message in prompt.messages),
                          self._limits)
        text = await self._run(render_chat, self._tokenizer, prompt)
        check_prompt_size("messages", [text], self._limits)
        return text

    async def encode_chat(self, prompt: ChatPrompt) -> list[int]:
        """A conversation's ids: its rendering already holds the special tokens."""
        return await self._run(self._ids, await self.render_chat(prompt), False)

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> Tokenization:
        """Every token of `text`, as a tokenizer route shows them."""
        check_prompt_size("prompt", [text], self._limits)
        return await self._run(self._tokenization, text, add_special_tokens)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self, function: Callable[..., Result], *args: object) -> Result:
        """`function` in the pool; a caller that leaves takes its turn back if it had not
        come yet (one already running finishes, its prompt bounded)."""
        if self._num_taken >= self._max_waiting:
            raise Overloaded(f"too many prompts being tokenized ({self._max_waiting}); "
                             "retry later")
        self._num_taken += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, function, *args)
        finally:
            self._num_taken -= 1

    def _ids(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._tokenizer(text, add_special_tokens=add_special_tokens).input_ids

    def _tokenization(self, text: str, add_special_tokens: bool) -> Tokenization:
        encoding = self._tokenizer(text, add_special_tokens=add_special_tokens,
                                   return_offsets_mapping=True)
        ids = encoding.input_ids
        return Tokenization(
            ids=ids, spans=[tuple(span) for span in encoding.offset_mapping],
            texts=token_texts(self._tokenizer, ids),
            vocabulary_strings=self._tokenizer.convert_ids_to_tokens(ids))
