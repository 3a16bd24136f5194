"""The engine with the real packaged model, in process: answers, parity with transformers'
greedy `generate`, clean streaming of Chinese text, reproducible seeds, stop strings."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.loader import _hf_folder, default_model_path
from engine.request import FinishReason, RequestOutput
from engine.validation import build_request

CACHE_DIR = Path.home() / ".cache" / "switchboard"


class EngineHarness:
    """One engine and one event loop for the module; each test runs coroutines on the loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.engine = AsyncEngine.from_config(EngineConfig(cache_dir=CACHE_DIR))
        self.engine.start(self.loop)
        self._ids = iter(range(1_000_000))

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def request(self, prompt: str | list[int], **parameters):
        token_ids = self.engine.encode(prompt) if isinstance(prompt, str) else prompt
        return build_request(f"r{next(self._ids)}", token_ids, parameters, self.engine.limits)

    async def events(self, request) -> list[RequestOutput]:
        async with contextlib.aclosing(self.engine.generate(request)) as stream:
            return [event async for event in stream]

    def generate(self, *requests) -> list[list[RequestOutput]]:
        async def together():
            return await asyncio.gather(*(self.events(request) for request in requests))
        return self.run(together())

    def close(self) -> None:
        self.run(self.engine.shutdown())
        self.loop.close()


@pytest.fixture(scope="module")
def harness() -> Iterator[EngineHarness]:
    harness = EngineHarness()
    yield harness
    harness.close()


def text_of(events: list[RequestOutput]) -> str:
    return "".join(event.text for event in events)


def token_ids_of(events: list[RequestOutput]) -> list[int]:
    return [token for event in events for token in event.new_token_ids]


def test_greedy_answer_names_paris(harness) -> None:
    [events] = harness.generate(harness.request("The capital of France is", do_sample=False))
    assert "Paris" in text_of(events)
    assert events[-1].finish_reason is FinishReason.LENGTH
    assert events[-1].num_generated_tokens == 20


def test_chat_prompt_stops_at_end_of_turn(harness) -> None:
    prompt = ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
              "<|im_start|>assistant\n")
    [events] = harness.generate(harness.request(prompt, do_sample=False, max_new_tokens=60))
    assert "Paris" in text_of(events)
    assert events[-1].finish_reason is FinishReason.EOS
    assert "<|im_end|>" not in text_of(events)


def test_greedy_tokens_equal_transformers_generate_for_concurrent_prompts(harness) -> None:
    prompts = ["Hi", "The capital of France is", "List three colours:",
               "Explain in one sentence why the sky is blue, and mention the sun.",
               "1, 2, 3, 4,", "def fibonacci(n):"]
    requests = [harness.request(p, do_sample=False, max_new_tokens=12) for p in prompts]
    results = harness.generate(*requests)
    model = AutoModelForCausalLM.from_pretrained(_hf_folder(default_model_path(), CACHE_DIR),
                                                 dtype=torch.float32)
    for request, events in zip(requests, results):
        input_ids = torch.tensor([request.prompt_token_ids])
        expected = model.generate(input_ids, do_sample=False, max_new_tokens=12,
                                  attention_mask=torch.ones_like(input_ids))
        reference = expected[0, input_ids.shape[1]:].tolist()
        assert token_ids_of(events) == reference[:len(token_ids_of(events))]
        assert len(token_ids_of(events)) == len(reference)


def test_chinese_stream_is_the_one_shot_decode_without_broken_characters(harness) -> None:
    prompt = "<|im_start|>user\n用中文介绍一下北京。<|im_end|>\n<|im_start|>assistant\n"
    [events] = harness.generate(harness.request(prompt, do_sample=False, max_new_tokens=40))
    one_shot = harness.engine.decode(token_ids_of(events))
    assert text_of(events) == one_shot
    assert all("\ufffd" not in event.text for event in events)
    assert any("\u4e00" <= char <= "\u9fff" for char in one_shot)


def test_a_seed_reproduces_its_text_alone_and_among_other_requests(harness) -> None:
    def seeded():
        return harness.request("Once upon a time", do_sample=True, temperature=1.0, top_k=50,
                               seed=42, max_new_tokens=16)

    [alone] = harness.generate(seeded())
    others = [harness.request(f"Story number {i}:", do_sample=True, max_new_tokens=16)
              for i in range(4)]
    crowded = harness.generate(*others, seeded())[-1]
    assert text_of(alone) == text_of(crowded)
    assert alone[-1].seed == 42


def test_an_unseeded_request_reports_the_seed_that_reproduces_it(harness) -> None:
    [first] = harness.generate(harness.request("Tell me a joke.", do_sample=True, max_new_tokens=12))
    [again] = harness.generate(harness.request("Tell me a joke.", do_sample=True,
                                               seed=first[-1].seed, max_new_tokens=12))
    assert text_of(first) == text_of(again)


def test_stop_string_ends_generation_and_is_not_shown(harness) -> None:
    [events] = harness.generate(harness.request("The capital of France is", do_sample=False,
                                                stop=["."]))
    assert text_of(events) == " Paris"
    assert events[-1].finish_reason is FinishReason.STOP


def test_token_prompt_and_text_prompt_agree(harness) -> None:
    token_ids = harness.engine.encode("The capital of France is")
    by_text, by_tokens = harness.generate(
        harness.request("The capital of France is", do_sample=False, max_new_tokens=6),
        harness.request(token_ids, do_sample=False, max_new_tokens=6))
    assert token_ids_of(by_text) == token_ids_of(by_tokens)
