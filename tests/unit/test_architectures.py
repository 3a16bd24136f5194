"""The paged runner computes each supported architecture as transformers does, including what
sets them apart from SmolLM2's Llama: biases (Qwen2's Q/K/V, Llama's optional attention and
MLP biases), tied embeddings, a head size of its own (as Mistral NeMo's), Qwen3's RMSNorm of
each query and key head, and sliding-window attention (Mistral on every layer, Qwen2 on its upper layers). Tiny models with random weights, compared logit by logit; an architecture
that is not supported is refused by name."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator

import pytest
import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, PreTrainedModel, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from switchboard.engine.measured_choice import FP32_PACKINGS, MeasuredChoice, OneDnnPacked
from switchboard.engine.paged_runner import PagedRunner, SequenceChunk, UnsupportedModel

BLOCK_SIZE = 4
NUM_BLOCKS = 64
VOCAB = 101
WINDOW = 8
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def llama_with_biases() -> PreTrainedModel:
    return LlamaForCausalLM(LlamaConfig(**SHAPE, attention_bias=True, mlp_bias=True,
                                        architectures=["LlamaForCausalLM"]))


def mistral_with_a_window() -> PreTrainedModel:
    return MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=WINDOW, head_dim=24,
                                            architectures=["MistralForCausalLM"]))


def qwen2_windowed_above_layer_two() -> PreTrainedModel:
    return Qwen2ForCausalLM(Qwen2Config(**SHAPE, use_sliding_window=True,
                                        sliding_window=WINDOW, max_window_layers=2,
                                        tie_word_embeddings=True,
                                        architectures=["Qwen2ForCausalLM"]))


def qwen3_with_its_own_head_size() -> PreTrainedModel:
    return Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=24, tie_word_embeddings=True,
                                        architectures=["Qwen3ForCausalLM"]))


MODELS = {"llama": llama_with_biases, "mistral": mistral_with_a_window,
          "qwen2": qwen2_windowed_above_layer_two, "qwen3": qwen3_with_its_own_head_size}


def build(name: str) -> PreTrainedModel:
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    for parameter in model.parameters():
        if parameter.dim() == 1:
            # Biases start at zero and norms' weights at one: vary them, or a dropped bias or
            # norms swapped (Qwen3's of queries and keys) would go unseen.
            with torch.no_grad():
                parameter.add_(torch.randn_like(parameter), alpha=0.5)
    return model


def reference_logits(model: PreTrainedModel, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@dataclasses.dataclass(frozen=True)
class Layout:
    """The packed GEMM the runner lays its float32 weights out for (None: none), and whether
    steps of few rows use the unpacked copies of some projections, which the runner
    otherwise decides by timing them at load and at the warm-up."""

    packing: type | None
    few_rows_unpacked: bool = False

    @property
    def keeps_unpacked_weights(self) -> bool:
        return self.packing is None or self.few_rows_unpacked


LAYOUTS = {"unpacked": Layout(None),
           **{packing.__name__: Layout(packing) for packing in FP32_PACKINGS},
           "OneDnnPacked-few-rows-unpacked": Layout(OneDnnPacked, few_rows_unpacked=True)}


@pytest.fixture(params=list(LAYOUTS))
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Layout:
    layout = LAYOUTS[request.param]
    if layout.packing is not None and not layout.packing.is_available():
        pytest.fail(f"this torch cannot run {layout.packing.__name__}: it cannot be checked")
    monkeypatch.setattr(PagedRunner, "_measure_packing", lambda self, model: layout.packing)
    few_rows = (MeasuredChoice.second_always() if layout.few_rows_unpacked
                else MeasuredChoice.first_always())
    monkeypatch.setattr(MeasuredChoice, "measure_in_turns", lambda self, *args: few_rows)
    return layout


@pytest.mark.parametrize("name", MODELS)
def test_a_prompt_in_chunks_then_decode_steps_match_transformers(name: str,
                                                                  layout: Layout) -> None:
    """Three sequences in one batch: a prompt past the window prefilled in two chunks while a
    short one is prefilled whole, then decode steps, static (padded) and eager alike."""
    model = build(name)
    generator = torch.Generator().manual_seed(1)
    ids = [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in (30, 5, 12)]
    tables = [list(range(i * 16, (i + 1) * 16)) for i in range(3)]
    for static_decode_batch in (0, 4):
        runner = PagedRunner(copy.deepcopy(model), torch.device("cpu"), NUM_BLOCKS, BLOCK_SIZE,
                             static_decode_batch=static_decode_batch)
        first = runner.execute([SequenceChunk("a", ids[0][:17], 0, tables[0], False,
                                              all_logits=True),
                                SequenceChunk("b", ids[1], 0, tables[1], True, all_logits=True)])
        rest = runner.execute([SequenceChunk("a", ids[0][17:], 17, tables[0], True,
                                             all_logits=True),
                               SequenceChunk("c", ids[2], 0, tables[2], True, all_logits=True)])
        ours = [torch.cat((first[:17], rest[:13])), first[17:], rest[13:]]
        for step in range(6):
            new = [(5 * step + row) % VOCAB for row in range(3)]
            logits = runner.execute([SequenceChunk(name, [token], len(seq), table, True)
                                     for name, token, seq, table in
                                     zip("abc", new, ids, tables)])
            for row, token in enumerate(new):
                ids[row].append(token)
                ours[row] = torch.cat((ours[row], logits[row:row + 1]))
        for row in range(3):
            torch.testing.assert_close(ours[row], reference_logits(model, ids[row]),
                                       rtol=1e-4, atol=1e-4)
        ids = [seq[:-6] for seq in ids]


@pytest.mark.parametrize("name", MODELS)
def test_steps_that_sample_some_tokens_or_none_return_those_tokens_logits(
        name: str, layout: Layout) -> None:
    """The usual steps, whose chunks want the logits at their last token only (or at none:
    the first chunk of a prompt), give those logits, and the K/V the next steps attend to."""
    model = build(name)
    generator = torch.Generator().manual_seed(2)
    ids = [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in (30, 12)]
    tables = [list(range(i * 16, (i + 1) * 16)) for i in range(2)]
    runner = PagedRunner(copy.deepcopy(model), torch.device("cpu"), NUM_BLOCKS, BLOCK_SIZE)
    assert runner.execute([SequenceChunk("a", ids[0][:10], 0, tables[0], False)]).shape[0] == 0
    steps = [[SequenceChunk("b", ids[1], 0, tables[1], True),
              SequenceChunk("a", ids[0][10:17], 10, tables[0], False)],
             [SequenceChunk("a", ids[0][17:], 17, tables[0], True),
              SequenceChunk("b", [7], 12, tables[1], True)],
             [SequenceChunk("a", [9], 30, tables[0], True),
              SequenceChunk("b", [8], 13, tables[1], True)]]
    for step in steps:
        logits = runner.execute(step)
        sampled = [chunk for chunk in step if chunk.samples]
        assert logits.shape[0] == len(sampled)
        for row, chunk in enumerate(sampled):
            sequence = ids[chunk.request_id == "b"]
            sequence[chunk.start:] = chunk.token_ids
            torch.testing.assert_close(logits[row], reference_logits(model, sequence)[-1],
                                       rtol=1e-4, atol=1e-4)


def test_an_unsupported_architecture_is_refused_naming_the_supported_ones() -> None:
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2,
                                       architectures=["GPT2LMHeadModel"]))
    with pytest.raises(UnsupportedModel, match="GPT2LMHeadModel is not supported.*"
                                               "LlamaForCausalLM.*Qwen2ForCausalLM"):
        PagedRunner(model, torch.device("cpu"), NUM_BLOCKS, BLOCK_SIZE)


@pytest.mark.parametrize("name", ["llama", "qwen2"])  # embeddings apart from the head, tied
def test_a_cpu_runner_keeps_no_view_of_the_models_weights(name: str, layout: Layout) -> None:
    """On a CPU the loader's checkpoint is a mapped file: a view of any weight kept the whole
    mapping resident. The runner's float32 weights are its own (copies, or a packed
    layout), as its quantized ones are; packed, it keeps unpacked copies only where steps of
    few rows use them."""
    model = build(name)
    parameters = list(model.parameters())  # alive, so their memory is not reused
    weights = {parameter.untyped_storage().data_ptr() for parameter in parameters}
    runner = PagedRunner(model, torch.device("cpu"), NUM_BLOCKS, BLOCK_SIZE)
    runner.warm_up()  # where steps of few rows are timed
    kept = list(tensors_reachable_from(runner))
    assert len(kept) > 4 * 4  # the layers' norms and biases at least
    # oneDNN's packed weights (layout torch._mkldnn) own their memory; the rest must too.
    assert not [tensor.shape for tensor in kept if tensor.layout == torch.strided
                and tensor.untyped_storage().data_ptr() in weights]
    down_shape = (SHAPE["hidden_size"], SHAPE["intermediate_size"])
    unpacked_downs = [tensor for tensor in kept if tensor.shape == down_shape
                      and tensor.layout == torch.strided
                      and tensor.untyped_storage().nbytes() == tensor.nbytes]
    assert len(unpacked_downs) == (SHAPE["num_hidden_layers"]
                                   if layout.keeps_unpacked_weights else 0)


def tensors_reachable_from(root: object) -> Iterator[torch.Tensor]:
    seen: set[int] = set()
    pending = [root]
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, torch.nn.Module):
            pending.extend(item.parameters())
        elif isinstance(item, list | tuple):
            pending.extend(item)
        elif dataclasses.is_dataclass(item):
            pending.extend(getattr(item, field.name) for field in dataclasses.fields(item))
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            pending.extend(vars(item).values())
