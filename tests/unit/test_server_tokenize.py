"""server.generation's Tokenize of chat messages, with a fake engine: the templated text is the
template's tokens decoded, and each token's span in it is told only where tokenizing that
text again gives the same tokens back. The real tokenizer's answers are in
tests/integration/test_generation_service.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from engine.chat import ChatMessage
from engine.config import EngineLimits
from proto import switchboard_pb2 as sb
from server.generation import GenerationServicer
from server.served_model import ServedModel

MODEL = "m"
LIMITS = EngineLimits(vocab_size=1000, max_seq_len=64, max_input_len=63, max_iter_times=64)
TEMPLATED = "<s>Hi"


class CharacterEngine:
    """One token per character, its code point; the chat template writes TEMPLATED. `lossy`:
    decoding adds a space, as a tokenizer that does not round-trip may."""

    is_healthy = True
    limits = LIMITS

    def __init__(self, lossy: bool = False) -> None:
        self.lossy = lossy

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        return [ord(character) for character in TEMPLATED]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(map(chr, token_ids)) + (" " if self.lossy else "")

    def encode_with_spans(self, text: str, add_special_tokens: bool = True
                          ) -> tuple[list[int], list[tuple[int, int]]]:
        return [ord(character) for character in text], [(i, i + 1) for i in range(len(text))]

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        return [chr(token_id) for token_id in token_ids]

    def vocabulary_strings(self, token_ids: Sequence[int]) -> list[str]:
        return [f"<{token_id}>" for token_id in token_ids]


def tokenize_chat(engine: CharacterEngine) -> sb.TokenizeResponse:
    served = ServedModel(MODEL)
    served.engine = engine
    request = sb.TokenizeRequest(messages=sb.ChatMessages(
        messages=[sb.ChatMessage(role="user", content="Hi")]))
    return asyncio.run(GenerationServicer(served).Tokenize(request, None))


def test_chat_tokens_come_with_the_templated_text_and_their_spans_in_it() -> None:
    response = tokenize_chat(CharacterEngine())
    assert response.templated_text == TEMPLATED
    assert list(response.ids) == [ord(character) for character in TEMPLATED]
    assert [(span.start, span.stop) for span in response.spans] == \
        [(i, i + 1) for i in range(len(TEMPLATED))]


def test_no_spans_where_the_templated_text_does_not_tokenize_back_into_the_same_tokens(
        ) -> None:
    response = tokenize_chat(CharacterEngine(lossy=True))
    assert response.templated_text == TEMPLATED + " "
    assert list(response.ids) == [ord(character) for character in TEMPLATED]
    assert not response.spans
