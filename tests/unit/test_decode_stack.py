"""A quantized model's decoding steps through the native decode stack (`DecodeStack`, all
layers in one call) give the same logits, bit for bit, as its layers called one by one, for
each packed kernel (PyTorch's int4, the native int4, int8), with biases and with a sliding
window; steps the stack does not take (a prompt beside decoding sequences) still compute as
before. Tiny random models; the load-time choices are fixed rather than timed."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from switchboard.engine import paged_runner
from switchboard.engine.paged_runner import DecodeStack, PagedRunner, SequenceChunk
from switchboard.engine.quantization import QuantizationPlan

BLOCK_SIZE = 4
WINDOW = 8
SHAPE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
MODELS = {
    "llama-with-biases": lambda: LlamaForCausalLM(LlamaConfig(
        **SHAPE, attention_bias=True, mlp_bias=True, architectures=["LlamaForCausalLM"])),
    "mistral-with-a-window": lambda: MistralForCausalLM(MistralConfig(
        **SHAPE, sliding_window=WINDOW, head_dim=32, architectures=["MistralForCausalLM"])),
}
# scheme, and whether the native int4 kernel is chosen over PyTorch's
KERNELS = {"torch-int4": ("int4", False), "native-int4": ("int4", True), "int8": ("int8", False)}
PROMPTS = {"a": [5, 17, 3, 42, 8, 23, 61, 2, 9, 30, 14], "b": [7, 7, 1, 99]}
DECODE_STEPS = 12  # past the window


def runner_for(model: torch.nn.Module, scheme: str, native_int4: bool, stacked: bool,
               monkeypatch: pytest.MonkeyPatch) -> PagedRunner:
    """A runner whose decoding sequences attend through the native kernel and multiply by the
    packed kernels at every number of rows, with or without the stack."""
    with monkeypatch.context() as patch:
        # Choices among [SDPA, grouped, native] attention and [PyTorch's, native] int4 kernels.
        patch.setattr(paged_runner, "fastest_in_turns",
                      lambda choices, *args: len(choices) - 1 if len(choices) == 3
                      else int(native_int4))
        patch.setattr(PagedRunner, "_measure_dense", lambda self: None)
        if not stacked:
            patch.setattr(DecodeStack, "build", classmethod(lambda cls, *args: None))
        runner = PagedRunner(copy.deepcopy(model), torch.device("cpu"), num_blocks=32,
                             block_size=BLOCK_SIZE, quantization=QuantizationPlan(scheme))
        runner.warm_up()
    assert (runner._decode_stack is not None) == stacked
    return runner


def steps(runner: PagedRunner) -> list[torch.Tensor]:
    """Logits of both prompts, then of DECODE_STEPS steps decoding both, then of a step with
    a third prompt beside them."""
    blocks = {"a": [1, 2, 3, 4, 5, 6], "b": [7, 8, 9, 10, 11], "c": [12, 13]}
    logits = [runner.execute([SequenceChunk(name, prompt, 0, blocks[name], samples=True)
                              for name, prompt in PROMPTS.items()])]
    for step in range(DECODE_STEPS):
        logits.append(runner.execute([
            SequenceChunk(name, [int(logits[-1][row].argmax())], len(prompt) + step,
                          blocks[name], samples=True)
            for row, (name, prompt) in enumerate(PROMPTS.items())]))
    logits.append(runner.execute([
        SequenceChunk("a", [3], len(PROMPTS["a"]) + DECODE_STEPS, blocks["a"], samples=True),
        SequenceChunk("c", [4, 5, 6], 0, blocks["c"], samples=True)]))
    return logits


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", MODELS)
def test_decoding_steps_through_the_stack_equal_the_layers_called_one_by_one(
        name: str, kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:  # biases and norms' weights away from 0 and 1
                parameter.add_(torch.randn_like(parameter), alpha=0.5)
    scheme, native_int4 = KERNELS[kernel]
    calls = []
    stack_call = DecodeStack.__call__
    monkeypatch.setattr(DecodeStack, "__call__",
                        lambda self, *args: calls.append(args) or stack_call(self, *args))
    stacked, layered = (steps(runner_for(model, scheme, native_int4, stacked, monkeypatch))
                        for stacked in (True, False))
    assert len(calls) == 1 + DECODE_STEPS  # the warm-up's and the decoding steps, stacked
    for ours, theirs in zip(stacked, layered, strict=True):
        assert torch.equal(ours, theirs)
