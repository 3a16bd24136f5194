"""The runner with deterministic inference (`batch_invariant`), on a tiny random float32
model: a token's logits are the same bits whatever else its step computes, and without the
native kernels the runner refuses to start rather than promise it."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from switchboard.engine import native
from switchboard.engine.paged_runner import PagedRunner, SequenceChunk

BLOCK_SIZE = 4
PROMPT = [5, 17, 3, 42, 8, 23, 61, 2, 9, 30, 14]


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        architectures=["LlamaForCausalLM"])).eval()


def test_a_prompts_last_logits_are_the_same_bits_alone_or_chunked_beside_others() -> None:
    runner = PagedRunner(tiny_model(), torch.device("cpu"), num_blocks=32, block_size=BLOCK_SIZE,
                         batch_invariant=True)
    runner.warm_up()
    alone = runner.execute([SequenceChunk("a", PROMPT, 0, [1, 2, 3], samples=True)])
    neighbours = [SequenceChunk(f"n{i}", [7 + i] * (5 + i), 0, [10 + 3 * i, 11 + 3 * i],
                                samples=True) for i in range(3)]
    runner.execute([SequenceChunk("b", PROMPT[:6], 0, [4, 5, 6], samples=False), *neighbours])
    chunked = runner.execute([*(SequenceChunk(chunk.request_id, [3], len(chunk.token_ids),
                                              chunk.block_ids, samples=True)
                                for chunk in neighbours),
                              SequenceChunk("b", PROMPT[6:], 6, [4, 5, 6], samples=True)])
    assert torch.equal(chunked[-1], alone[0])
    assert runner.measured_choices() == {"decoding attention": "native kernel"}


def test_without_the_native_kernels_deterministic_inference_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "kernels", lambda: None)
    with pytest.raises(ValueError, match="native CPU kernels"):
        PagedRunner(tiny_model(), torch.device("cpu"), num_blocks=8, block_size=BLOCK_SIZE,
                    batch_invariant=True)
