"""The engine with the real packaged model, in process: answers, parity with transformers'
greedy `generate`, clean streaming of Chinese text, reproducible seeds, stop strings.

These run on the CPU in float32 (`quantization="none"`, not `auto`, which serves the packaged
.gguf model in its own quantization, whose agreement with transformers
tests/integration/test_quantized_model.py measures within its tolerance) wherever they run, so
that exact parity is checked on every machine; the tests that compare a seeded sequence with
itself computed in other steps run with deterministic inference. Where a CUDA device is
present, the tests at the end check the CUDA path too (bfloat16, decode steps replayed from
CUDA graphs)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Iterator

import pytest
import torch
from transformers import AutoModelForCausalLM

from switchboard.engine.async_engine import AsyncEngine
from switchboard.engine.config import EngineConfig
from switchboard.engine.errors import InvalidRequest, PromptTooLong
from switchboard.engine.loader import default_model_path, hf_folder, load_model
from switchboard.engine.paged_runner import PagedRunner, SequenceChunk
from switchboard.engine.request import FinishReason, RequestOutput
from switchboard.engine.validation import build_request
from switchboard.cli import default_cache_dir

CACHE_DIR = default_cache_dir()


class EngineHarness:
    """One engine and one event loop; each test runs coroutines on the loop."""

    def __init__(self, **config: object) -> None:
        config.setdefault("device", "cpu")
        config.setdefault("quantization", "none")
        self.loop = asyncio.new_event_loop()
        self.engine = AsyncEngine.from_config(EngineConfig(cache_dir=CACHE_DIR, **config))
        self.engine.start(self.loop)
        self._ids = iter(range(1_000_000))

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def encode(self, text: str) -> list[int]:
        return self.run(self.engine.prompts.encode(text))

    def request(self, prompt: str | list[int], **parameters):
        token_ids = self.encode(prompt) if isinstance(prompt, str) else prompt
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


@pytest.fixture(scope="module")
def deterministic() -> Iterator[EngineHarness]:
    """For the tests that compare a seeded sequence with itself computed in other steps: by
    default the logits may differ in their last bits with what else a step computes
    (docs/engine.md#deterministic-inference)."""
    harness = EngineHarness(enable_deterministic_inference=True)
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


PARITY_PROMPTS = ["Hi", "The capital of France is", "List three colours:",
                  "Explain in one sentence why the sky is blue, and mention the sun.",
                  "1, 2, 3, 4,", "def fibonacci(n):"]
SYSTEM_PROMPT = ("<|im_start|>system\nYou are a concise assistant. Answer in one short sentence, "
                 "without lists, and never apologise.<|im_end|>\n<|im_start|>user\n")


@pytest.fixture(scope="module")
def reference_model():
    return AutoModelForCausalLM.from_pretrained(hf_folder(default_model_path(), CACHE_DIR),
                                                dtype=torch.float32)


def assert_greedy_parity(harness, reference_model, prompts, max_new_tokens=12):
    """Greedy tokens from the engine, all prompts submitted together, equal transformers'
    generate(do_sample=False) run one prompt at a time."""
    requests = [harness.request(p, do_sample=False, max_new_tokens=max_new_tokens)
                for p in prompts]
    results = harness.generate(*requests)
    for request, events in zip(requests, results):
        input_ids = torch.tensor([request.prompt_token_ids])
        expected = reference_model.generate(input_ids, do_sample=False,
                                            max_new_tokens=max_new_tokens,
                                            attention_mask=torch.ones_like(input_ids))
        assert token_ids_of(events) == expected[0, input_ids.shape[1]:].tolist()
    return results


def test_greedy_tokens_equal_transformers_generate_for_concurrent_prompts(
        harness, reference_model) -> None:
    assert_greedy_parity(harness, reference_model, PARITY_PROMPTS)


def test_greedy_parity_holds_when_a_small_kv_pool_forces_preemption(reference_model) -> None:
    small = EngineHarness(num_kv_blocks=8, block_size=8, max_batched_tokens=64)
    try:
        assert_greedy_parity(small, reference_model, PARITY_PROMPTS, max_new_tokens=24)
        stats = small.engine.stats()
        assert stats.num_preemptions > 0
        assert stats.num_free_blocks == stats.num_total_blocks
    finally:
        small.close()


def test_greedy_parity_holds_when_a_shared_system_prompt_hits_the_prefix_cache(
        harness, reference_model) -> None:
    questions = ["What is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
                 "Name a colour.<|im_end|>\n<|im_start|>assistant\n"]
    assert_greedy_parity(harness, reference_model, [SYSTEM_PROMPT + questions[0]])
    [second] = assert_greedy_parity(harness, reference_model, [SYSTEM_PROMPT + questions[1]])
    shared_tokens = len(harness.encode(SYSTEM_PROMPT))
    block_size = harness.engine.info.block_size
    assert second[-1].num_cached_tokens == shared_tokens // block_size * block_size > 0


def test_prompt_logprobs_equal_transformers_log_softmax(harness, reference_model) -> None:
    """Beside another request whose 45-token prompt takes most of a step's 64 tokens, so the
    asking prompt is usually prefilled in two chunks; its system prompt is in the prefix
    cache after the prefix-cache test above, and must not be reused."""
    other = harness.request(", ".join(str(i) for i in range(1, 15)), do_sample=False,
                            max_new_tokens=4)
    asking = harness.request(SYSTEM_PROMPT + "Why is the sea salty?<|im_end|>\n",
                             do_sample=False, max_new_tokens=2, prompt_logprobs=True,
                             logprobs=True, top_logprobs=2)
    _, events = harness.generate(other, asking)
    input_ids = torch.tensor([asking.prompt_token_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(reference_model(input_ids).logits[0].float(), dim=-1)
    expected = logprobs[:-1].gather(1, input_ids[0, 1:].unsqueeze(1)).squeeze(1).tolist()
    top = logprobs[:-1].topk(2, dim=-1)
    first, *rest = [event.prompt_logprobs for event in events]
    assert first[0] is None
    assert tuple(entry.token_id for entry in first[1:]) == asking.prompt_token_ids[1:]
    assert [entry.logprob for entry in first[1:]] == pytest.approx(expected, abs=1e-3)
    # The two most likely tokens at each position (ties aside), with their log-probabilities.
    for entry, ids, values in zip(first[1:], top.indices.tolist(), top.values.tolist()):
        assert [token_id for token_id, _ in entry.top][0] == ids[0]
        assert [logprob for _, logprob in entry.top] == pytest.approx(values, abs=1e-3)
    assert rest == [()] * len(rest)
    assert events[-1].num_cached_tokens == 0


def test_chinese_stream_is_the_one_shot_decode_without_broken_characters(harness) -> None:
    prompt = "<|im_start|>user\n用中文介绍一下北京。<|im_end|>\n<|im_start|>assistant\n"
    [events] = harness.generate(harness.request(prompt, do_sample=False, max_new_tokens=40))
    one_shot = harness.engine.decode(token_ids_of(events))
    assert text_of(events) == one_shot
    assert all("\ufffd" not in event.text for event in events)
    assert any("\u4e00" <= char <= "\u9fff" for char in one_shot)


def test_a_seed_reproduces_its_text_alone_and_among_eight_other_requests(
        deterministic) -> None:
    def seeded():
        return deterministic.request("Once upon a time", do_sample=True, temperature=1.0,
                                     top_k=50, seed=42, max_new_tokens=16)

    [alone] = deterministic.generate(seeded())
    others = [deterministic.request(f"Story number {i}:", do_sample=True, max_new_tokens=16)
              for i in range(8)]
    crowded = deterministic.generate(*others, seeded())[-1]
    assert text_of(alone) == text_of(crowded)
    assert alone[-1].seed == 42


def test_speculation_keeps_greedy_parity_and_seeded_samples_and_saves_steps(
        deterministic, reference_model) -> None:
    """Deterministic, so that a token computed in a verifying step's chunk has the logits it
    has computed alone."""
    speculating = EngineHarness(num_speculative_tokens=3, speculative_max_batch=8,
                                enable_deterministic_inference=True)
    try:
        repeating = "Repeat after me: the cat sat on the mat. The cat sat on the mat. The cat"
        steps_before = speculating.engine.stats().num_steps
        assert_greedy_parity(speculating, reference_model, [repeating], max_new_tokens=24)
        assert speculating.engine.stats().num_steps - steps_before < 24 // 2
        assert_greedy_parity(speculating, reference_model, PARITY_PROMPTS, max_new_tokens=24)

        def seeded(engine: EngineHarness):
            return engine.request("Once upon a time", do_sample=True, temperature=0.7,
                                  seed=42, max_new_tokens=24)

        [plain], [speculated] = deterministic.generate(seeded(deterministic)), \
            speculating.generate(seeded(speculating))
        assert token_ids_of(speculated) == token_ids_of(plain)
        stats = speculating.engine.stats()
        assert stats.num_free_blocks == stats.num_total_blocks
    finally:
        speculating.close()


def test_structured_output_follows_a_json_schema_a_choice_and_a_regex(harness) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "is_capital": {"type": "boolean"}},
              "required": ["city", "is_capital"]}
    chat = ("<|im_start|>user\nThe capital of France, as JSON.<|im_end|>\n"
            "<|im_start|>assistant\n")
    as_json, choice, phone = harness.generate(
        harness.request(chat, do_sample=False, max_new_tokens=60, guided_json=schema),
        harness.request("Is Paris in France?", do_sample=True, seed=3, max_new_tokens=8,
                        guided_choice=["yes", "no"]),
        harness.request("A phone number:", do_sample=True, seed=3, max_new_tokens=12,
                        guided_regex=r"[0-9]{3}-[0-9]{4}"))
    answer = json.loads(text_of(as_json))
    assert set(answer) == {"city", "is_capital"} and "Paris" in answer["city"]
    assert isinstance(answer["is_capital"], bool)
    assert text_of(choice) in ("yes", "no")
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", text_of(phone))
    assert all(events[-1].finish_reason is FinishReason.EOS
               for events in (as_json, choice, phone))


def test_a_regex_the_vocabulary_cannot_follow_is_refused_naming_it(harness) -> None:
    with pytest.raises(InvalidRequest) as info:
        harness.generate(harness.request("Hi", guided_regex="(unclosed"))
    assert info.value.field == "guided_regex"


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
    token_ids = harness.encode("The capital of France is")
    by_text, by_tokens = harness.generate(
        harness.request("The capital of France is", do_sample=False, max_new_tokens=6),
        harness.request(token_ids, do_sample=False, max_new_tokens=6))
    assert token_ids_of(by_text) == token_ids_of(by_tokens)


# The densest texts for a byte-level BPE: its longest token (a line break and 80 spaces, in
# SmolLM2), characters of several bytes, common words; none has fewer tokens than its bytes
# over the longest token's, the bound the prompt size check rests on.
DENSE_TEXTS = ["\n" + " " * 80, "👍", "北京", "Hello world, ", "<|im_start|>", "\x00\x7f"]


@pytest.mark.parametrize("piece", DENSE_TEXTS)
def test_no_text_has_fewer_tokens_than_its_bytes_over_the_longest_tokens(harness,
                                                                          piece: str) -> None:
    limits = harness.engine.limits
    text = piece * (limits.max_prompt_bytes // len(piece.encode()))
    assert len(harness.encode(text)) * limits.max_token_bytes >= len(text.encode())


def test_a_prompt_one_byte_over_the_limit_is_refused_naming_it(harness) -> None:
    with pytest.raises(PromptTooLong) as refused:
        harness.encode("a" * (harness.engine.limits.max_prompt_bytes + 1))
    assert refused.value.field == "prompt"


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CHINESE_PROMPT = "<|im_start|>user\n用中文介绍一下北京。<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def cuda_harness() -> Iterator[EngineHarness]:
    harness = EngineHarness(device="cuda")
    yield harness
    harness.close()


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_concurrent_requests_answer_and_stream_cleanly(cuda_harness) -> None:
    requests = [cuda_harness.request(prompt, do_sample=False, max_new_tokens=40)
                for prompt in ["The capital of France is", CHINESE_PROMPT, *PARITY_PROMPTS]]
    paris, chinese, *_ = cuda_harness.generate(*requests)
    assert cuda_harness.engine.info.dtype == "bfloat16"
    assert "Paris" in text_of(paris)
    # In bfloat16 the model may itself emit a lone byte token (U+FFFD in any decode): the
    # stream must still be the one-shot decode, character for character.
    assert text_of(chinese) == cuda_harness.engine.decode(token_ids_of(chinese))
    assert any("\u4e00" <= char <= "\u9fff" for char in text_of(chinese))
    stats = cuda_harness.engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_graph_replayed_decode_steps_give_the_eager_logits() -> None:
    """Teacher-forced decode steps of 6 sequences, the next tokens chosen by the eager runner:
    the graph runner's logits agree within bfloat16's rounding and pick the same token. The
    two attend with different kernels (graphs: cuDNN's, over a masked bucket of context;
    eager: flash, unmasked), whose bfloat16 results differ by up to 4 units in the last place
    of the largest logits after 30 layers (measured on an H100: up to 1.0 for logits up to
    46); a wrong slot or position gives differences of whole logits."""
    config = EngineConfig(cache_dir=CACHE_DIR, device="cuda")
    loaded = load_model(config)
    tokenizer = loaded.tokenizer
    eager = PagedRunner(loaded.model, torch.device("cuda"), 64, 16)
    graphs = PagedRunner(load_model(config).model, torch.device("cuda"), 64, 16,
                         static_decode_batch=8)
    prompts = [tokenizer.encode(prompt) for prompt in PARITY_PROMPTS]
    tables = [list(range(8 * i, 8 * i + 8)) for i in range(len(prompts))]
    chunks = [SequenceChunk(f"s{i}", prompt, 0, tables[i], True)
              for i, prompt in enumerate(prompts)]
    agreeing = total = 0
    for _ in range(24):
        expected, replayed = eager.execute(chunks), graphs.execute(chunks)
        assert (expected - replayed).abs().max() < 0.05 * expected.abs().max()
        agreeing += int((expected.argmax(-1) == replayed.argmax(-1)).sum())
        total += len(chunks)
        chunks = [SequenceChunk(chunk.request_id, [int(token)], chunk.start + len(chunk.token_ids),
                                chunk.block_ids, True)
                  for chunk, token in zip(chunks, expected.argmax(-1))]
    assert agreeing / total >= 0.97
