"""Weight-only quantization (`--quantization int8|int4|gguf`; gguf is the packaged model's
default) with the real packaged model:
quality is measured, not assumed. Teacher-forced over a fixed text, the quantized runner's
top-1 next token agrees with the float32 model's at least 95% of the time for int8 and gguf,
90% for int4, whichever dense form multiplies many rows; the greedy answers of the foundation
tests still hold."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from switchboard.engine.config import EngineConfig
from switchboard.engine.loader import load_model
from switchboard.engine.paged_runner import PagedRunner, SequenceChunk
from switchboard.engine.quantization import Bf16Copy, DenseCopy, Fp16Copy
from test_engine_real_model import CACHE_DIR, EngineHarness, text_of, token_ids_of

TEXT = (
    "The river town woke slowly on market days. Before sunrise the bakers had already lit "
    "their ovens, and the smell of bread drifted down the narrow streets towards the water. "
    "Fishermen pulled their boats onto the gravel bank and sorted the night's catch into "
    "baskets of ice, while their children ran between the stalls that were going up in the "
    "square. By seven o'clock the first farmers arrived with carts of potatoes, cabbages and "
    "apples, and the old clock above the town hall struck the hour with a tired, familiar "
    "sound. Most people in the town had lived there all their lives. They knew which "
    "merchant sold honest weights and which one talked too much, which cheese would keep "
    "through the winter and which would not last a week. Visitors came mostly in summer, "
    "when the boats took them up the valley to see the castle ruins and the waterfalls. In "
    "the autumn the town belonged to its own people again. The school reopened, the leaves "
    "turned yellow along the river, and the evenings grew long enough for stories. The "
    "teacher, a patient woman who had taught two generations of the same families, liked "
    "to begin the year with a simple question: what do you want to learn? Some children "
    "wanted to build bridges, others wanted to cure animals or write books. One boy said "
    "he wanted to understand why the river never stopped moving, even in the coldest "
    "winter, when the edges froze and the middle still ran dark and fast. She told him that "
    "was a good question, perhaps the best one, because it would lead him to mountains, "
    "rain, the sea and the sun, and that every answer would bring a new question with it. "
    "Years later he became an engineer who designed water systems for cities far away, and "
    "whenever he came home he walked along the bank in the early morning, listening to the "
    "current and remembering the classroom where the question had started."
)
AGREEMENT = {"int8": 0.95, "int4": 0.90, "gguf": 0.95}
CHUNK_TOKENS = 64
BLOCK_SIZE = 16


def top1_tokens(runner: PagedRunner, token_ids: list[int]) -> torch.Tensor:
    """The runner's most likely next token after each prefix of token_ids, prefilled in
    chunks as the engine does."""
    blocks = list(range(len(token_ids) // BLOCK_SIZE + 1))
    logits = [runner.execute([SequenceChunk("text", token_ids[start:start + CHUNK_TOKENS],
                                            start, blocks, samples=True, all_logits=True)])
              for start in range(0, len(token_ids), CHUNK_TOKENS)]
    return torch.cat(logits).argmax(dim=-1)


@pytest.fixture(scope="module")
def reference() -> tuple[list[int], torch.Tensor]:
    """The text's tokens and the float32 transformers model's top-1 after each prefix."""
    loaded = load_model(EngineConfig(cache_dir=CACHE_DIR))
    token_ids = loaded.tokenizer(TEXT).input_ids
    with torch.inference_mode():
        logits = loaded.model(torch.tensor([token_ids])).logits[0]
    return token_ids, logits.argmax(dim=-1)


@pytest.mark.parametrize("dense_copy", [
    pytest.param(None, id="fp32-dequantised"),
    pytest.param(Fp16Copy, id="fp16-copies"),
    pytest.param(Bf16Copy, id="bf16-copies", marks=pytest.mark.onednn_bf16),
])
@pytest.mark.parametrize("scheme", sorted(AGREEMENT))
def test_teacher_forced_top1_agrees_with_float32(scheme: str, dense_copy: DenseCopy | None,
                                                 reference) -> None:
    """Whichever way a quantized runner multiplies many rows: weights dequantised to fp32 at
    each product, fp16 copies (CPUs without bf16 units), or bf16 copies and a bf16 KV cache
    (CPUs with bf16 matrix units); this text's 64-token prefill chunks take it."""
    token_ids, expected = reference
    assert len(token_ids) > 350
    loaded = load_model(EngineConfig(cache_dir=CACHE_DIR, quantization=scheme))
    runner = PagedRunner(loaded.model, loaded.device, len(token_ids) // BLOCK_SIZE + 1,
                         BLOCK_SIZE, loaded.quantization, dense_copy=dense_copy)
    agreement = (top1_tokens(runner, token_ids) == expected).float().mean().item()
    assert agreement >= AGREEMENT[scheme], f"{scheme}: {agreement:.1%} top-1 agreement"


def test_the_default_serves_the_packaged_gguf_model_as_the_gguf_scheme() -> None:
    """`make run`'s default: the packaged .gguf model in its own precisions, the plan the
    gguf scheme's tolerance above (and its greedy answers below) are tested with."""
    default = load_model(EngineConfig(cache_dir=CACHE_DIR)).quantization
    gguf = load_model(EngineConfig(cache_dir=CACHE_DIR, quantization="gguf")).quantization
    assert default == gguf
    assert default.scheme == "gguf" and 4 in default.gguf_bits.values()


@pytest.fixture(scope="module", params=sorted(AGREEMENT))
def quantized(request) -> Iterator[EngineHarness]:
    harness = EngineHarness(quantization=request.param, max_prefill_tokens=CHUNK_TOKENS)
    yield harness
    harness.close()


def test_greedy_answers_still_hold(quantized: EngineHarness) -> None:
    question = ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                "<|im_start|>assistant\n")
    chinese = "<|im_start|>user\n用中文介绍一下北京。<|im_end|>\n<|im_start|>assistant\n"
    paris, beijing = quantized.generate(
        quantized.request(question, do_sample=False, max_new_tokens=30),
        quantized.request(chinese, do_sample=False, max_new_tokens=40))
    assert "Paris" in text_of(paris)
    one_shot = quantized.engine.decode(token_ids_of(beijing))
    assert text_of(beijing) == one_shot
    assert "\ufffd" not in one_shot
    assert any("\u4e00" <= char <= "\u9fff" for char in one_shot)


def test_a_prompt_longer_than_a_step_is_prefilled_over_steps_that_sample_nothing(
        quantized: EngineHarness) -> None:
    """With maxPrefillTokens 64 a step computes at most 64 prompt tokens: the first steps of
    this prompt sample no row, so the LM head gets no rows to compute."""
    prompt = quantized.encode(TEXT)
    assert len(prompt) > 2 * CHUNK_TOKENS
    events, = quantized.generate(quantized.request(prompt, do_sample=False, max_new_tokens=4,
                                                   ignore_eos=True))
    assert len(token_ids_of(events)) == 4


def test_deterministic_inference_samples_a_seeded_sequence_alike_wherever_it_runs() -> None:
    """--enable-deterministic-inference: the same log-probabilities to the last bit, so the
    same tokens, whether the sequence runs alone, again with its prompt's start read from
    the prefix cache, as one of n, or beside requests being prefilled and decoded. Without it
    the log-probabilities differ by up to about 1e-2 here."""
    harness = EngineHarness(quantization="gguf", enable_deterministic_inference=True)
    story = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
             "Tell me a story about a dragon.<|im_end|>\n<|im_start|>assistant\n")

    def seeded(n: int = 1):
        return harness.request(story, do_sample=True, temperature=1.0, seed=11, n=n,
                               max_new_tokens=12, logprobs=True, ignore_eos=True)

    def sampled(events) -> list[tuple[int, float]]:
        return [(token.token_id, token.logprob) for event in events for token in event.logprobs]

    try:
        [first] = harness.generate(seeded())
        assert len(harness.encode(story)) > BLOCK_SIZE  # its first block is cached from now on
        [again] = harness.generate(seeded())
        [both] = harness.generate(seeded(n=2))
        others = [harness.request(TEXT[:100 * (i + 1)], do_sample=True, max_new_tokens=8 + i)
                  for i in range(4)]
        crowded = harness.generate(*others, seeded())[-1]
        expected = sampled(first)
        assert len(expected) == 12
        assert sampled(again) == sampled(crowded) == expected
        assert sampled([event for event in both if event.index == 0]) == expected
    finally:
        harness.close()
