"""engine.detokenizer.IncrementalDetokenizer with the real tokenizer of the default model.

The tokenizer comes from the same cache the server uses (~/.cache/switchboard); on a fresh
machine the one-time GGUF conversion takes about 25 s.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from transformers import AutoTokenizer

from switchboard.engine import loader
from switchboard.engine.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from switchboard.cli import default_cache_dir

IM_END = 2
TEXTS = {
    "english": "Hello, world! How are you today?",
    "chinese": "你好，世界！今天天气很好。",
    "emoji": "👍🏽 ok",
    "mixed": "Mixed: café 😀 数据 and <b>tags</b>\n  indented",
}
CORPUS = ("你好，世界！今天天气很好。 👍🏽 ok 😀 café naïve Ελληνικά русский 日本語のテキスト "
          "🇫🇷 한국어 🎉🎉 Hello, world!\n\tdone.")
# Prompts whose decoded text is whole characters (the last four tokens, the detokenizer's left
# context, may still start inside a character).
CLEAN_PROMPTS = ("", "User: 你好", "Say 👍🏽 twice:", "日本語のテキスト", "plain English prompt")


@pytest.fixture(scope="module")
def tokenizer() -> object:
    return AutoTokenizer.from_pretrained(loader.hf_folder(loader.default_model_path(),
                                                          default_cache_dir()))


def encode(tokenizer: object, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def stream(tokenizer: object, token_ids: Sequence[int], prompt_ids: Sequence[int] = (),
           skip_special_tokens: bool = True) -> tuple[list[str], str]:
    """The per-token deltas and the final flush."""
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)
    deltas = [detokenizer.add(token_id) for token_id in token_ids]
    return deltas, detokenizer.flush()


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_streamed_text_equals_one_shot_decode_without_broken_characters(tokenizer: object,
                                                                          text: str) -> None:
    ids = encode(tokenizer, text)
    deltas, tail = stream(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tail == ""
    assert not [delta for delta in deltas if REPLACEMENT_CHAR in delta]


def test_a_character_split_over_tokens_is_released_with_its_last_token(tokenizer: object) -> None:
    ids = encode(tokenizer, "👍")
    assert len(ids) > 1
    deltas, _ = stream(tokenizer, ids)
    assert deltas == [""] * (len(ids) - 1) + ["👍"]


def test_flush_releases_an_unfinished_character(tokenizer: object) -> None:
    partial = encode(tokenizer, "ok👍")[:-1]
    deltas, tail = stream(tokenizer, partial)
    assert "".join(deltas) == "ok"
    assert tail == tokenizer.decode(partial, skip_special_tokens=True)[2:]
    assert tail.endswith(REPLACEMENT_CHAR)


def test_special_tokens_produce_no_text(tokenizer: object) -> None:
    ids = [*encode(tokenizer, "Hello"), IM_END, *encode(tokenizer, " world"), IM_END]
    deltas, tail = stream(tokenizer, ids)
    assert deltas[len(encode(tokenizer, "Hello"))] == ""
    assert deltas[-1] == ""
    assert "".join(deltas) + tail == "Hello world"


def test_special_tokens_are_text_when_not_skipped(tokenizer: object) -> None:
    ids = [*encode(tokenizer, "Hello"), IM_END, *encode(tokenizer, " world")]
    prompt = encode(tokenizer, "Hi") + [IM_END]
    deltas, tail = stream(tokenizer, ids, prompt, skip_special_tokens=False)
    assert deltas[len(encode(tokenizer, "Hello"))] == "<|im_end|>"
    assert "".join(deltas) + tail == "Hello<|im_end|> world"


@pytest.mark.parametrize(("prompt", "generated"), [
    ("User: hello\nAssistant:", " Hi there!"),
    ("User: 你好", "，世界！"),
    ("Say 👍🏽 twice:", " 👍🏽👍🏽"),
    ("a", "b"),
])
def test_with_a_prompt_the_output_is_the_generated_text_alone(tokenizer: object, prompt: str,
                                                              generated: str) -> None:
    prompt_ids = encode(tokenizer, prompt)
    generated_ids = encode(tokenizer, generated)
    deltas, tail = stream(tokenizer, generated_ids, prompt_ids)
    assert "".join(deltas) + tail == tokenizer.decode(generated_ids, skip_special_tokens=True)
    assert "".join(deltas) + tail == generated


def test_streaming_equals_one_shot_decode_for_random_token_ids(tokenizer: object) -> None:
    hypothesis = pytest.importorskip("hypothesis")
    strategies = hypothesis.strategies
    corpus_ids = sorted(set(encode(tokenizer, CORPUS)))
    token_id = strategies.one_of(strategies.sampled_from(corpus_ids),
                                 strategies.integers(0, len(tokenizer) - 1))

    @hypothesis.settings(max_examples=100, deadline=None, database=None)
    @hypothesis.given(ids=strategies.lists(token_id, max_size=40),
                      prompt=strategies.sampled_from(CLEAN_PROMPTS))
    def streaming_matches_one_shot(ids: list[int], prompt: str) -> None:
        deltas, tail = stream(tokenizer, ids, encode(tokenizer, prompt))
        expected = tokenizer.decode(ids, skip_special_tokens=True)
        assert "".join(deltas) + tail == expected
        if REPLACEMENT_CHAR not in expected:
            assert not [delta for delta in deltas if REPLACEMENT_CHAR in delta]

    streaming_matches_one_shot()
