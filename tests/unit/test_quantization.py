"""Weight-only quantization on fake weights: the grids, both multiplication paths (the
weight-only kernels for few rows, dequantisation or a dense copy for many) computing the same
weights, the embedding lookup, and which bits each scheme gives each matrix."""

from __future__ import annotations

from pathlib import Path

import numpy
import pytest
import torch
from gguf import GGUFReader, GGUFWriter

from switchboard.engine.measured_choice import MeasuredChoice
from switchboard.engine.quantization import (DEQUANTIZE_CHANNELS, INT4_GROUP_SIZE, Bf16Copy, Fp16Copy,
                                 QuantizationError, QuantizationPlan, QuantizedEmbedding,
                                 QuantizedProjection, QuantizedWeight, RefinedHead, Scratch,
                                 gguf_bits, gguf_tensor_infos, resolve_scheme)

CPU = torch.device("cpu")


def dequantized(weight: QuantizedWeight) -> torch.Tensor:
    return weight.dequantize(slice(0, weight.shape[0]))


@pytest.mark.parametrize("bits", [4, 8])
def test_quantization_error_is_within_half_a_step(bits: int) -> None:
    weight = torch.randn(64, 128)
    quantized = QuantizedWeight.quantize(weight, bits)
    steps = quantized.scales.expand(64, -1, 128 // quantized.scales.shape[1]).reshape(64, 128)
    assert ((dequantized(quantized) - weight).abs() <= steps * 0.5 + 1e-6).all()


def test_int4_reproduces_a_q4_1_grid_exactly() -> None:
    """Weights already on a Q4_1 grid (code × scale + min per block of 32, codes spanning
    0..15) come back unchanged: the gguf scheme keeps such a file's own weights."""
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (8, 4, INT4_GROUP_SIZE), generator=generator)
    codes[..., 0], codes[..., 1] = 0, 15
    scales = torch.tensor([0.5, 0.25, 0.125, 2.0]).view(1, 4, 1)
    minimums = torch.tensor([-1.0, -3.0, 0.5, -8.0]).view(1, 4, 1)
    weight = (codes * scales + minimums).view(8, -1)
    assert torch.equal(dequantized(QuantizedWeight.quantize(weight, 4)), weight)


def test_int4_keeps_a_q4_1_files_fp16_scales_and_minimums() -> None:
    """A GGUF file keeps each Q4_1 block's scale and minimum in fp16, 3 bits more than bf16:
    rounded to bf16 they moved the weights enough to flip SmolLM2's answer to the README's
    chat example, so the dequantised weights keep them."""
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (8, 4, INT4_GROUP_SIZE), generator=generator)
    codes[..., 0], codes[..., 1] = 0, 15
    scales = torch.tensor([0.0123, 0.0371, 0.00917, 0.0549]).half().float().view(1, 4, 1)
    minimums = torch.tensor([-0.0951, -0.2187, -0.0713, -0.4133]).half().float().view(1, 4, 1)
    assert not torch.equal(scales.bfloat16().float(), scales)
    weight = (codes * scales + minimums).view(8, -1)
    assert torch.allclose(dequantized(QuantizedWeight.quantize(weight, 4)), weight,
                          rtol=0, atol=1e-6)


@pytest.mark.parametrize("bits", [4, 8])
def test_zero_rows_and_constant_groups_survive(bits: int) -> None:
    weight = torch.zeros(4, 64)
    weight[1] = 3.0 if bits == 4 else 0.0
    assert torch.equal(dequantized(QuantizedWeight.quantize(weight, bits)), weight)


def test_int4_needs_whole_groups_and_only_4_or_8_bits_exist() -> None:
    with pytest.raises(QuantizationError, match="multiples of 32"):
        QuantizedWeight.quantize(torch.randn(4, 48), 4)
    with pytest.raises(QuantizationError, match="4 or 8 bits"):
        QuantizedWeight.quantize(torch.randn(4, 64), 2)


# The dense forms: fp32 dequantisation at each product, as x @ Wᵀ or (W @ xᵀ)ᵀ, or a copy;
# each with the result's dtype and its error relative to the largest output, beyond 1e-5.
DENSE_FORMS = {
    "fp32": ({"transposed": MeasuredChoice.first_always()}, None, torch.float32, 0),
    "fp32-transposed": ({"transposed": MeasuredChoice.second_always()}, None, torch.float32, 0),
    "fp16-copy": ({}, Fp16Copy, torch.float32, 2e-3),
    "bf16-copy": ({}, Bf16Copy, torch.bfloat16, 0.02),
}


def projection_of(weight: QuantizedWeight, bias: torch.Tensor | None, form: str,
                  **kwargs) -> QuantizedProjection:
    """A projection computing `form` as its dense form."""
    options, copy, _, _ = DENSE_FORMS[form]
    projection = QuantizedProjection(weight, bias, Scratch(), **options, **kwargs)
    if copy is not None:
        projection.add_copy(copy)
    return projection


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 3, 12, 40])
@pytest.mark.parametrize("form", [
    pytest.param(form, marks=pytest.mark.onednn_bf16) if form == "bf16-copy" else form
    for form in DENSE_FORMS])
def test_both_paths_compute_the_dequantized_weight(bits: int, rows: int, form: str) -> None:
    """The bf16 weight-only kernel (bf16 activations: ~1% error) and the dense form, fp32
    dequantisation (exact, over several dequantisation slices, in either matmul form), an fp16
    copy (~0.05% error) or a bf16 copy (~1%), multiply by the same weight; the dense form is
    used where the measurement said it was faster."""
    _, _, dtype, error = DENSE_FORMS[form]
    out_features = DEQUANTIZE_CHANNELS + 96
    weight = QuantizedWeight.quantize(torch.randn(out_features, 128) / 10, bits)
    bias = torch.randn(out_features)
    projection = projection_of(weight, bias, form)
    x = torch.randn(rows, 128)
    expected = x @ dequantized(weight).t()
    packed, dense = projection.packed_mm(x), projection.dense_mm(x)
    assert packed.dtype == torch.bfloat16
    assert dense.dtype == dtype
    scale = expected.abs().max()
    assert torch.allclose(dense.float(), expected, atol=error * scale + 1e-5)
    assert torch.allclose(packed.float(), expected, atol=0.02 * scale + 1e-5)
    assert torch.allclose(projection(x), packed + bias)
    assert torch.allclose(projection.dense_mm(x.bfloat16()).float(), expected,
                          atol=0.02 * scale + 1e-5)
    dense_first = projection_of(weight, bias, form, dense=MeasuredChoice.second_always())
    assert torch.allclose(dense_first(x), dense + bias)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("form", [
    "fp16-copy", pytest.param("bf16-copy", marks=pytest.mark.onednn_bf16)])
def test_a_tied_head_with_a_copy_still_looks_up_exact_rows(bits: int, form: str) -> None:
    weight = QuantizedWeight.quantize(torch.randn(112, 64), bits)
    head = projection_of(weight, None, form, lookups=True)
    token_ids = torch.tensor([5, 0, 111, 5])
    assert torch.equal(QuantizedEmbedding(head)(token_ids), dequantized(weight)[token_ids])


@pytest.mark.parametrize("bits", [4, 8])
def test_a_copy_measured_faster_at_every_row_count_is_all_a_projection_keeps(bits: int) -> None:
    weight = QuantizedWeight.quantize(torch.randn(112, 64), bits)
    head = projection_of(weight, None, "fp16-copy", dense=MeasuredChoice.second_always(),
                         lookups=True)
    x = torch.randn(3, 64)
    before = head(x)
    head.drop_packed()
    assert torch.equal(head(x), before)
    token_ids = torch.tensor([5, 0, 111])
    assert torch.equal(QuantizedEmbedding(head)(token_ids), dequantized(weight)[token_ids])
    with pytest.raises(AttributeError):
        head.packed_mm(x)
    with pytest.raises(ValueError, match="needs its packed form"):
        projection_of(weight, None, "fp32").drop_packed()


@pytest.mark.parametrize("use_native", [True, False], ids=["native", "pytorch"])
def test_a_projection_multiplies_by_the_int4_kernel_it_keeps(use_native: bool) -> None:
    """The native kernel's float32 result is within 2e-4 of the dequantised weight's (relative
    to the largest output), PyTorch's is bf16; once one is kept, the projection multiplies by
    it."""
    weight = QuantizedWeight.quantize(torch.randn(112, 64), 4)
    bias = torch.randn(112)
    projection = QuantizedProjection(weight, bias, Scratch())
    x = torch.randn(3, 64)
    pytorch = projection.packed_mm(x)
    projection.add_native()
    projection.uses_native = True
    native = projection.packed_mm(x)
    assert (native.dtype, pytorch.dtype) == (torch.float32, torch.bfloat16)
    expected = x @ dequantized(weight).t()
    assert torch.allclose(native, expected, atol=2e-4 * expected.abs().max().item())
    projection.keep_one_kernel(use_native)
    assert torch.equal(projection(x), (native if use_native else pytorch) + bias)


def test_projections_share_one_scratch_buffer() -> None:
    scratch = Scratch()
    small = QuantizedProjection(QuantizedWeight.quantize(torch.randn(64, 64), 8), None, scratch)
    large = QuantizedProjection(QuantizedWeight.quantize(torch.randn(256, 64), 8), None, scratch)
    x = torch.randn(12, 64)
    large.dense_mm(x)
    buffer = scratch.buffer
    small.dense_mm(x)
    assert scratch.buffer is buffer
    assert buffer.numel() == 256 * 64


@pytest.mark.parametrize("bits", [4, 8])
def test_embedding_looks_up_dequantized_rows(bits: int) -> None:
    weight = QuantizedWeight.quantize(torch.randn(100, 64), bits)
    token_ids = torch.tensor([5, 0, 99, 5])
    assert torch.equal(QuantizedEmbedding(weight)(token_ids), dequantized(weight)[token_ids])


def test_int8_and_int4_plans() -> None:
    int8 = QuantizationPlan("int8")
    int4 = QuantizationPlan("int4")
    assert int8.bits(0, ["attn_q"]) == 8 and int8.bits(None, ["output"]) == 8
    assert int4.bits(3, ["ffn_gate", "ffn_up"]) == 4
    assert int4.bits(None, ["output"]) == 8
    assert not QuantizationPlan("none").is_quantized and int4.is_quantized


def test_the_gguf_plan_keeps_each_matrix_at_its_file_precision() -> None:
    plan = QuantizationPlan("gguf", {"blk.0.attn_q": 4, "blk.0.attn_k": 4, "blk.0.attn_v": 8,
                                     "blk.0.ffn_down": 4, "token_embd": 8})
    assert plan.bits(0, ["attn_q", "attn_k"]) == 4
    assert plan.bits(0, ["attn_q", "attn_k", "attn_v"]) == 8  # the widest part decides
    assert plan.bits(0, ["ffn_down"]) == 4
    assert plan.bits(1, ["ffn_down"]) == 8  # unknown: 8 bits
    assert plan.bits(None, ["output"]) == 8  # a tied head is the embedding


def test_auto_serves_a_gguf_file_in_its_own_quantization_on_cpu_unless_a_dtype_is_asked(
        tmp_path: Path) -> None:
    """What `make run` serves by default: a .gguf file in its own precisions on a CPU, as
    llama.cpp serves it; a Hugging Face folder, an accelerator or an asked-for dtype keep the
    weights unquantized; an explicit scheme is itself."""
    gguf, folder, cuda = tmp_path / "model.gguf", tmp_path / "model", torch.device("cuda")
    assert resolve_scheme("auto", gguf, CPU, torch.float32, dtype_asked=False) == "gguf"
    assert resolve_scheme("auto", gguf, CPU, torch.float32, dtype_asked=True) == "none"
    assert resolve_scheme("auto", gguf, cuda, torch.bfloat16, dtype_asked=False) == "none"
    assert resolve_scheme("auto", folder, CPU, torch.float32, dtype_asked=False) == "none"
    assert resolve_scheme("int4", folder, CPU, torch.float32, dtype_asked=True) == "int4"
    assert resolve_scheme("none", gguf, CPU, torch.float32, dtype_asked=False) == "none"
    assert QuantizationPlan.for_model("auto", folder, CPU, torch.float32).scheme == "none"
    with pytest.raises(QuantizationError, match="quantization must be one of none, int8"):
        QuantizationPlan("auto")  # a plan holds a resolved scheme


def test_a_gguf_files_tensors_are_read_from_its_header_as_ggufs_reader_reads_them(
        tmp_path: Path) -> None:
    """Past metadata of every kind (strings, arrays of strings and of arrays, scalars)."""
    path = tmp_path / "model.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_array("tokenizer.ggml.tokens", ["a", "é", "<s>"])
    writer.add_array("nested", [[1, 2], [3]])
    writer.add_uint32("count", 7)
    writer.add_float64("ratio", 1.5)
    writer.add_bool("flag", True)
    writer.add_string("name", "x")
    writer.add_tensor("blk.0.attn_q.weight", numpy.zeros((4, 32), numpy.float32))
    writer.add_tensor("blk.0.attn_norm.weight", numpy.zeros(32, numpy.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_tensor_infos(path) == [(tensor.name, len(tensor.shape), tensor.tensor_type.name)
                                       for tensor in GGUFReader(path).tensors]
    assert gguf_bits(path) == {"blk.0.attn_q": 8}
    notes = tmp_path / "notes.gguf"
    notes.write_bytes(b"text, not a GGUF file's header")
    with pytest.raises(QuantizationError, match="not a GGUF file"):
        gguf_bits(notes)


def test_plans_refuse_what_they_cannot_do(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    with pytest.raises(QuantizationError, match="quantization must be one of"):
        QuantizationPlan("int2")
    with pytest.raises(QuantizationError, match="CPU in float32"):
        QuantizationPlan.for_model("int8", folder, torch.device("cuda"), torch.bfloat16)
    with pytest.raises(QuantizationError, match="CPU in float32"):
        QuantizationPlan.for_model("int4", folder, CPU, torch.bfloat16)
    with pytest.raises(QuantizationError, match="not a .gguf file"):
        QuantizationPlan.for_model("gguf", folder, CPU, torch.float32)
    assert QuantizationPlan.for_model("none", folder, torch.device("cuda"),
                                      torch.bfloat16).scheme == "none"


def test_the_refined_head_decides_a_near_tie_the_bf16_kernels_round_away() -> None:
    """Two logits 0.03 apart near 25, one bf16 step (0.125) wide: the kernel returns both as
    25.25 and its argmax is the first; the refined head's float32 logits pick the second,
    and leave the logits below its eight highest as the kernel computed them."""
    codes = torch.zeros(16, 64, dtype=torch.int8)
    codes[0], codes[1] = 39, 39
    codes[0, :28] += 1  # 2524 x the scale: 25.265
    codes[1, :31] += 1  # 2527 x the scale: 25.295
    codes[2:, :8] = torch.arange(2, 16, dtype=torch.int8).view(-1, 1)
    scales = torch.full((16, 1, 1), 0.01).to(torch.bfloat16).float()
    weight = QuantizedWeight(8, codes, scales, None)
    projection = QuantizedProjection(weight, None, Scratch(), lookups=True)
    hidden = torch.ones(1, 64)
    rounded = projection(hidden).float()
    assert rounded[0, 0] == rounded[0, 1] == 25.25 and rounded.argmax() == 0

    refined = RefinedHead(projection)(hidden)
    exact = hidden @ dequantized(weight).t()
    assert refined.argmax() == 1
    top_eight = [0, 1, *range(10, 16)]
    assert torch.allclose(refined[0, top_eight], exact[0, top_eight])
    assert torch.equal(refined[0, 2:10], rounded[0, 2:10])
    # A step whose chunks all continue a prompt samples no row.
    assert RefinedHead(projection)(torch.ones(0, 64)).shape == (0, 16)
