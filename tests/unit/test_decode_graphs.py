"""Static decode batches (what CUDA graphs replay), checked on the CPU without a graph: padding
rows and padded context change no real sequence's logits or cache. And the runner's float32
residual stream for a bf16 model (CUDA's default dtype), checked on the CPU too."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from switchboard.engine.decode_graphs import MAX_GRAPH_BATCH, batch_buckets, context_bucket
from switchboard.engine.measured_choice import MeasuredChoice
from switchboard.engine.paged_runner import PagedRunner, SequenceChunk

BLOCK_SIZE = 8
NUM_BLOCKS = 160  # 4 sequences of up to 320 tokens


def test_batch_buckets_cover_every_size_up_to_the_largest() -> None:
    assert batch_buckets(20) == (1, 2, 4, 8, 16, 20)
    assert batch_buckets(16) == (1, 2, 4, 8, 16)
    assert batch_buckets(1) == (1,)
    assert batch_buckets(1000)[-1] == MAX_GRAPH_BATCH


def test_context_buckets_are_powers_of_two_capped_by_the_pool() -> None:
    assert context_bucket(1, 4096) == 256
    assert context_bucket(257, 4096) == 512
    assert context_bucket(3000, 2600) == 2600


@pytest.fixture(scope="module")
def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, architectures=["LlamaForCausalLM"])
    return LlamaForCausalLM(config).eval()


def runners(model: LlamaForCausalLM) -> tuple[PagedRunner, PagedRunner]:
    """The same weights twice: every step eager, and decode steps padded for up to 4 rows.
    Both multiply as nn.Linear does: each runner's load-time timing of the ways to multiply is
    noise on a model this small, and two runners that chose differently gave logits that
    differed in the last bit (a CI run failed so)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PagedRunner, "_measure_transposed",
                      staticmethod(lambda model: MeasuredChoice.first_always()))
        patch.setattr(PagedRunner, "_measure_packing", lambda self, model: None)
        eager = PagedRunner(copy.deepcopy(model), torch.device("cpu"), NUM_BLOCKS, BLOCK_SIZE)
        static = PagedRunner(copy.deepcopy(model), torch.device("cpu"), NUM_BLOCKS, BLOCK_SIZE,
                             static_decode_batch=4)
    return eager, static


def blocks(sequence: int) -> list[int]:
    per_sequence = NUM_BLOCKS // 4
    return list(range(sequence * per_sequence, (sequence + 1) * per_sequence))


def test_padded_decode_steps_give_the_eager_logits(tiny_model) -> None:
    eager, static = runners(tiny_model)
    generator = torch.Generator().manual_seed(1)
    # Three sequences: padded to a batch of 4; the longest crosses the 256-token context bucket.
    prompts = [torch.randint(0, 97, (n,), generator=generator).tolist() for n in (5, 40, 250)]
    prefill = [SequenceChunk(f"s{i}", prompt, 0, blocks(i), True)
               for i, prompt in enumerate(prompts)]
    assert torch.equal(eager.execute(prefill), static.execute(prefill))
    lengths = [len(prompt) for prompt in prompts]
    for step in range(10):
        # The first sequence sits out every other step: batches of 3 and 2 take turns.
        active = [i for i in range(3) if i or step % 2]
        decode = [SequenceChunk(f"s{i}", [(7 * step + i) % 97], lengths[i], blocks(i), True)
                  for i in active]
        expected, padded = eager.execute(decode), static.execute(decode)
        assert padded.shape == expected.shape == (len(active), 97)
        torch.testing.assert_close(padded, expected, rtol=1e-5, atol=1e-5)
        for i in active:
            lengths[i] += 1
    assert max(lengths) > 256


def test_steps_that_are_not_pure_decodes_run_eagerly_with_the_same_results(tiny_model) -> None:
    eager, static = runners(tiny_model)
    mixed = [SequenceChunk("a", [1, 2, 3], 0, blocks(0), True),
             SequenceChunk("b", [4], 0, blocks(1), True),
             SequenceChunk("c", [5, 6], 0, blocks(2), False, all_logits=True)]
    torch.testing.assert_close(static.execute(mixed), eager.execute(mixed))
    too_many = [SequenceChunk(f"s{i}", [i + 1], 0, [i], True) for i in range(6)]
    torch.testing.assert_close(static.execute(too_many), eager.execute(too_many))


def test_a_bfloat16_model_keeps_a_float32_residual_stream_closer_to_float32() -> None:
    """A bf16 model's logits, against its float32 original's: ours keep the residual stream
    in float32, so they err less than transformers' bf16 forward (about 0.6x here; with a
    bf16 stream it was 0.96x)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, architectures=["LlamaForCausalLM"])
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 97, (40,)).tolist()
    with torch.no_grad():
        exact = model(torch.tensor([ids])).logits[0]
        transformers_bf16 = copy.deepcopy(model).to(torch.bfloat16)(
            torch.tensor([ids])).logits[0].float()
    runner = PagedRunner(copy.deepcopy(model).to(torch.bfloat16), torch.device("cpu"),
                         NUM_BLOCKS, BLOCK_SIZE)
    ours = runner.execute([SequenceChunk("s", ids, 0, blocks(0), True, all_logits=True)])
    assert ours.dtype == torch.float32
    ours_error = (ours - exact).abs().mean()
    assert ours_error < 0.85 * (transformers_bf16 - exact).abs().mean()
