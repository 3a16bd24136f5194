"""engine.tokenization and the prompt size check of engine.validation: a prompt's UTF-8 size
is checked against what max_input_len tokens can hold before its tokenizer or chat template
sees it, and tokenizing runs in the pool, never on the event loop, with a bounded number of
prompts taken at once."""

from __future__ import annotations

import asyncio
import threading

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from switchboard.engine.chat import ChatMessage, ChatPrompt
from switchboard.engine.config import EngineLimits
from switchboard.engine.errors import Overloaded, PromptTooLong
from switchboard.engine.loader import longest_token_bytes
from switchboard.engine.tokenization import PromptTokenizer, TokenTexts
from switchboard.engine.validation import check_prompt_size

LIMITS = EngineLimits(vocab_size=100, max_seq_len=64, max_input_len=4, max_iter_times=32,
                      max_token_bytes=3)
LIMIT = LIMITS.max_prompt_bytes  # 12


class RecordingTokenizer:
    """One token per character; records the thread of each call and the texts it saw."""

    chat_template = "{{ messages }}"

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.threads: list[threading.Thread] = []
        self.texts: list[str] = []
        self.gate = gate

    def __call__(self, text: str, add_special_tokens: bool = True) -> object:
        self.threads.append(threading.current_thread())
        self.texts.append(text)
        if self.gate is not None:
            self.gate.wait(5)
        return type("Encoding", (), {"input_ids": [ord(c) for c in text]})

    def apply_chat_template(self, messages: list[dict], **options: object) -> str:
        self.threads.append(threading.current_thread())
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)


def test_a_prompt_of_the_limits_bytes_passes_and_one_byte_more_is_too_long() -> None:
    check_prompt_size("prompt", ["a" * LIMIT], LIMITS)
    with pytest.raises(PromptTooLong) as refused:
        check_prompt_size("prompt", ["a" * (LIMIT - 1) + "é"], LIMITS)  # é: two bytes
    assert refused.value.field == "prompt"
    assert f"is over {LIMIT} bytes" in refused.value.reason


def test_the_texts_of_a_prompt_count_together() -> None:
    check_prompt_size("messages", ["a" * (LIMIT - 2), "bb"], LIMITS)
    with pytest.raises(PromptTooLong):
        check_prompt_size("messages", ["a" * (LIMIT - 2), "bbb"], LIMITS)


def test_the_longest_token_counts_special_tokens_and_a_byte_for_a_stripped_space() -> None:
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1},
                                                    unk_token="[UNK]")))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    assert longest_token_bytes(tokenizer) == len("<|im_start|>") + 1


def test_prompts_are_tokenized_off_the_event_loop() -> None:
    tokenizer = RecordingTokenizer()

    async def encode() -> list[int]:
        prompts = PromptTokenizer(tokenizer, LIMITS, max_waiting=4)
        try:
            return await prompts.encode_chat(ChatPrompt([ChatMessage("user", "hi")]))
        finally:
            prompts.shutdown()

    assert asyncio.run(encode()) == [ord(c) for c in "<user>hi"]
    assert threading.current_thread() not in tokenizer.threads
    assert len(tokenizer.threads) == 2  # the template, then the tokenizer


@pytest.mark.parametrize("call", [
    lambda prompts: prompts.encode("a" * (LIMIT + 1)),
    lambda prompts: prompts.tokenize("a" * (LIMIT + 1)),
    lambda prompts: prompts.encode_chat(ChatPrompt([ChatMessage("user", "a" * 8),
                                                    ChatMessage("user", "a" * 8)])),
])
def test_a_prompt_over_the_limit_never_reaches_the_tokenizer_or_the_template(call) -> None:
    tokenizer = RecordingTokenizer()

    async def refused() -> PromptTooLong:
        prompts = PromptTokenizer(tokenizer, LIMITS, max_waiting=4)
        try:
            with pytest.raises(PromptTooLong) as caught:
                await call(prompts)
            return caught.value
        finally:
            prompts.shutdown()

    assert asyncio.run(refused()).field in ("prompt", "messages")
    assert tokenizer.threads == []


def test_a_rendered_conversation_over_the_limit_is_refused_before_tokenizing() -> None:
    """The messages fit; the template's markup takes them over."""
    tokenizer = RecordingTokenizer()

    async def refused() -> PromptTooLong:
        prompts = PromptTokenizer(tokenizer, LIMITS, max_waiting=4)
        try:
            with pytest.raises(PromptTooLong) as caught:
                await prompts.encode_chat(ChatPrompt([ChatMessage("user", "a" * LIMIT)]))
            return caught.value
        finally:
            prompts.shutdown()

    assert asyncio.run(refused()).field == "messages"
    assert tokenizer.texts == []


def test_prompts_past_those_it_may_take_at_once_are_overloaded() -> None:
    gate = threading.Event()
    tokenizer = RecordingTokenizer(gate)

    async def third_of_two() -> None:
        prompts = PromptTokenizer(tokenizer, LIMITS, max_waiting=2)
        taken = [asyncio.ensure_future(prompts.encode("a")) for _ in range(2)]
        await asyncio.sleep(0)
        try:
            with pytest.raises(Overloaded):
                await prompts.encode("a")
        finally:
            gate.set()
            await asyncio.gather(*taken)
            prompts.shutdown()

    asyncio.run(third_of_two())


def test_token_texts_are_each_tokens_own_text_decoded_once() -> None:
    decoded: list[list[int]] = []

    class CharacterTokenizer:
        def batch_decode(self, sequences: list[list[int]]) -> list[str]:
            decoded.extend(sequences)
            return ["".join(map(chr, ids)) for ids in sequences]

    texts = TokenTexts(CharacterTokenizer())
    assert texts([104, 105, 104]) == ["h", "i", "h"]
    assert texts([105, 33]) == ["i", "!"]
    assert decoded == [[104], [105], [33]]
