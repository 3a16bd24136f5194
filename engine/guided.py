"""Structured output: a request's text kept to a regular expression (written from a JSON
schema, from a list of choices, or given) by letting it choose, at each step, only tokens that
can continue a match: outlines-core's index of the expression over the vocabulary, and a
guide per request that follows the tokens chosen.

Compiling an index takes milliseconds for a typical schema, seconds for a generic JSON object
over a 49k vocabulary, and without bounds as much memory and time as a short pattern asks
for: `GuideBuilder` compiles in bounded processes (see `index_compiler.py`), after the request
has been admitted, and keeps recent indexes within a budget of bytes.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from outlines_core import Guide, Index
from outlines_core.json_schema import build_regex_from_schema
from transformers.convert_slow_tokenizer import bytes_to_unicode

from switchboard.engine.errors import InvalidRequest
from switchboard.engine.index_compiler import CompileLimits, CompileRefused, compile_index
from switchboard.engine.params import OutputPattern

# Compiles at once; each takes a core at most, at a low priority (see index_compiler.py).
NUM_COMPILERS = 2
# SentencePiece's byte tokens and word-start mark.
BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
WORD_START = "\u2581"
BIT_SHIFTS = torch.arange(32, dtype=torch.int32)


def allowed_tokens(guide: Guide, vocab_size: int) -> torch.Tensor:
    """[vocab_size] bool: the tokens the guide allows now. outlines-core writes them as bits
    into int32 words, far faster than taking its list of ids
    (docs/engine-measurements.md#structured-output)."""
    words = torch.zeros(-(-vocab_size // 32), dtype=torch.int32)
    guide.write_mask_into(words.data_ptr(), words.numel(), words.element_size())
    return ((words.unsqueeze(-1) >> BIT_SHIFTS) & 1).bool().view(-1)[:vocab_size]


def json_schema_pattern(field: str, schema: object) -> OutputPattern:
    """The text of a JSON value that the schema (an object, or its JSON text) validates."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    try:
        return OutputPattern(field, build_regex_from_schema(text))
    except (ValueError, TypeError) as error:
        raise InvalidRequest(field, f"is not a JSON schema this server can follow: {error}") \
            from None


def choice_pattern(field: str, choices: Iterable[str]) -> OutputPattern:
    """Exactly one of the choices."""
    return OutputPattern(field, "|".join(f"({re.escape(choice)})" for choice in choices))


class GuideBuilder:
    """Guides for one model's vocabulary: `vocabulary` gives, once needed, each non-special
    token's bytes and ids; `eos_token_id` is the token a guide allows once a match is
    complete. Indexes are compiled by `index_compiler` within `limits`, at most
    `num_compilers` at once (the others wait their turn), one compile for all the requests
    that wait for the same expression; the most recently used are kept while their
    serialized sizes add up to at most `cache_bytes`."""

    def __init__(self, vocabulary: Callable[[], Mapping[bytes, list[int]]], eos_token_id: int,
                 *, limits: CompileLimits, cache_bytes: int,
                 num_compilers: int = NUM_COMPILERS) -> None:
        self._read_vocabulary = vocabulary
        self._eos_token_id = eos_token_id
        self._vocabulary: bytes | None = None
        self._limits = limits
        self._cache_bytes = cache_bytes
        self._indexes: OrderedDict[str, tuple[Index, int]] = OrderedDict()
        self._compiling: dict[str, _Compiling] = {}
        self._turns = asyncio.Semaphore(num_compilers)

    @classmethod
    def for_tokenizer(cls, tokenizer: object, eos_token_id: int, *, limits: CompileLimits,
                      cache_bytes: int) -> GuideBuilder:
        return cls(lambda: token_bytes(tokenizer), eos_token_id, limits=limits,
                   cache_bytes=cache_bytes)

    @property
    def num_cached_bytes(self) -> int:
        return sum(size for _, size in self._indexes.values())

    async def guide(self, pattern: OutputPattern) -> Guide:
        """A new guide for the pattern. Raises InvalidRequest naming the pattern's field if
        it cannot be followed, or not within the compile limits. Leaving the call abandons
        the compile unless other requests still wait for it."""
        cached = self._indexes.get(pattern.regex)
        if cached is not None:
            self._indexes.move_to_end(pattern.regex)
            return Guide(cached[0])
        compiling = self._compiling.get(pattern.regex)
        if compiling is None:
            compiling = _Compiling(asyncio.create_task(self._compile(pattern.regex)))
            self._compiling[pattern.regex] = compiling
        compiling.num_waiting += 1
        try:
            return Guide(await asyncio.shield(compiling.task))
        except CompileRefused as refusal:
            raise InvalidRequest(pattern.field, refusal.reason) from None
        finally:
            compiling.num_waiting -= 1
            if not compiling.num_waiting:
                compiling.task.cancel()  # kills its process, if it still runs
                del self._compiling[pattern.regex]

    async def _compile(self, regex: str) -> Index:
        async with self._turns:
            if self._vocabulary is None:  # reading a tokenizer's takes a moment: not on the loop
                self._vocabulary = await asyncio.to_thread(
                    lambda: pickle.dumps((self._eos_token_id, dict(self._read_vocabulary()))))
            serialized = await compile_index(regex, self._vocabulary, self._limits)
        index = await asyncio.to_thread(Index.from_binary, serialized)
        self._keep(regex, index, len(serialized))
        return index

    def _keep(self, regex: str, index: Index, size: int) -> None:
        """Cache the index, evicting the least recently used; one larger than the whole
        cache is used by its requests and not kept."""
        if size > self._cache_bytes:
            return
        self._indexes[regex] = (index, size)
        while self.num_cached_bytes > self._cache_bytes:
            self._indexes.popitem(last=False)


@dataclass(slots=True)
class _Compiling:
    """A compile in progress, and how many requests wait for it."""

    task: asyncio.Task[Index]
    num_waiting: int = 0


def token_bytes(tokenizer: object) -> dict[bytes, list[int]]:
    """Each non-special token's bytes → its ids: byte-level BPE tokens (GPT-2's alphabet, as
    SmolLM2, Llama 3 and Qwen2 write them) through that alphabet, SentencePiece's with '▁' as
    a space and '<0xNN>' as byte NN."""
    vocabulary: dict[str, int] = tokenizer.get_vocab()
    special = set(tokenizer.all_special_ids)
    tokens = {token: token_id for token, token_id in vocabulary.items() if token_id not in special}
    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
    byte_level = all(char in byte_of for token in tokens for char in token)
    result: dict[bytes, list[int]] = {}
    for token, token_id in tokens.items():
        byte_token = BYTE_TOKEN.fullmatch(token)
        if byte_token:
            data = bytes([int(byte_token.group(1), 16)])
        elif byte_level:
            data = bytes(byte_of[char] for char in token)
        else:
            data = token.replace(WORD_START, " ").encode()
        result.setdefault(data, []).append(token_id)
    return result
