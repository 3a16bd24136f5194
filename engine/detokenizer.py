"""Incremental detokenisation that never emits a broken character.

Byte-level BPE splits one character over several tokens; decoding a prefix then shows
U+FFFD. Text is released only once the decoded window no longer ends in U+FFFD, and the
window keeps a few tokens of left context because some tokenizers (SentencePiece) decode a
token's leading space differently at the start of a string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from transformers import PreTrainedTokenizerBase
from transformers.tokenization_utils_tokenizers import TokenizersBackend

REPLACEMENT_CHAR = "\ufffd"
CONTEXT_TOKENS = 4


class Decoder(Protocol):
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


def direct_decoder(tokenizer: Decoder) -> Decoder:
    """The `tokenizers` tokenizer under a transformers one where its decode gives the same
    text (no clean-up of spaces, no decode of the class's own), else `tokenizer`: the
    wrapper converts and checks its arguments at every call, four times the work of decoding
    a few tokens, twice per token and stream."""
    kind = type(tokenizer)
    if (isinstance(tokenizer, TokenizersBackend)
            and kind.decode is PreTrainedTokenizerBase.decode
            and kind._decode is TokenizersBackend._decode
            and not tokenizer.clean_up_tokenization_spaces):
        return tokenizer.backend_tokenizer
    return tokenizer


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, prompt_token_ids: Sequence[int],
                 skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._token_ids = list(prompt_token_ids[-CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._token_ids)

    def add(self, token_id: int) -> str:
        """Append one generated token; return the text that became final with it."""
        self._token_ids.append(token_id)
        return self._release(final=False)

    def flush(self) -> str:
        """At the end of generation, release whatever is held back, broken bytes included."""
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        window = self._token_ids[self._prefix_offset:]
        read = self._read_offset - self._prefix_offset
        prefix_text = self._decode(window[:read])
        text = self._decode(window)
        if len(text) <= len(prefix_text) or (text.endswith(REPLACEMENT_CHAR) and not final):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        return text[len(prefix_text):]

    def _decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens)
