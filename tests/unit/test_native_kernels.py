"""The native kernels (engine/csrc): decode attention against SDPA over gathered keys and
values, at head sizes that take each of its vector widths and its scalar path, and its refusal
of inputs that would read outside the caches; the int4 product against the dequantised
weight; a layer's small operations against transformers' and PyTorch's (the RMSNorms are in
test_rms_norm.py). `make install` builds them: they must be there."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from switchboard.engine import native
from switchboard.engine.quantization import QuantizedWeight

HEADS, KV_HEADS, SEQUENCES, CONTEXT, SLOTS = 6, 2, 5, 40, 300


def kernels() -> object:
    ops = native.kernels()
    assert ops is not None, "the native kernels were not built"
    return ops


@pytest.mark.parametrize("dtype", native.DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 8, 12, 5])
def test_decode_attention_equals_sdpa_over_the_gathered_context(dtype: torch.dtype,
                                                                head_dim: int) -> None:
    torch.manual_seed(0)
    k_cache = torch.randn(SLOTS, KV_HEADS, head_dim).to(dtype)
    v_cache = torch.randn(SLOTS, KV_HEADS, head_dim).to(dtype)
    slots = torch.randint(0, SLOTS, (SEQUENCES, CONTEXT))
    lengths = torch.tensor([1, 7, 40, 23, 16])
    queries = torch.randn(SEQUENCES, HEADS, head_dim).to(dtype)
    mask = (torch.arange(CONTEXT) < lengths.view(-1, 1)).view(SEQUENCES, 1, 1, CONTEXT)
    expected = F.scaled_dot_product_attention(
        queries.float().view(SEQUENCES, KV_HEADS, HEADS // KV_HEADS, head_dim),
        k_cache[slots].float().transpose(1, 2), v_cache[slots].float().transpose(1, 2),
        attn_mask=mask).reshape(SEQUENCES, HEADS * head_dim)
    out = kernels().decode_attention(queries, k_cache, v_cache, slots, lengths, 0,
                                     head_dim ** -0.5)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(out.float(), expected, atol=tolerance)


@pytest.mark.parametrize("slot, length", [(SLOTS, CONTEXT), (-1, CONTEXT), (0, CONTEXT + 1)],
                         ids=["slot-past-the-cache", "negative-slot", "length-past-its-slots"])
def test_decode_attention_refuses_to_read_outside_its_inputs(slot: int, length: int) -> None:
    caches = torch.zeros(SLOTS, KV_HEADS, 8)
    slots = torch.zeros(1, CONTEXT, dtype=torch.long)
    slots[0, -1] = slot
    with pytest.raises(RuntimeError, match="outside the caches|past its row"):
        kernels().decode_attention(torch.zeros(1, HEADS, 8), caches, caches, slots,
                                   torch.tensor([length]), 0, 1.0)


@pytest.mark.parametrize("rows", [1, 3, 4, 9])
@pytest.mark.parametrize("in_features", [96, 576], ids=["odd-groups", "even-groups"])
def test_int4_linear_multiplies_by_the_dequantized_weight_each_row_as_alone(
        rows: int, in_features: int) -> None:
    """int16 activations per group: within 2e-4 of the largest output (PyTorch's bf16 kernel
    errs by ~1%), and a row's result has the same bits among others as alone."""
    torch.manual_seed(0)
    weight = QuantizedWeight.quantize(torch.randn(200, in_features) / 10, 4)
    packed = kernels().int4_pack(weight.codes, weight.scales, weight.zeros)
    x = torch.randn(rows, in_features)
    expected = x.double() @ weight.dequantize(slice(0, 200)).double().t()
    y = kernels().int4_linear(x, *packed)
    assert y.dtype == torch.float32 and y.shape == (rows, 200)
    assert torch.allclose(y.double(), expected, atol=2e-4 * expected.abs().max().item())
    assert torch.equal(torch.cat([kernels().int4_linear(row[None], *packed) for row in x]), y)


def test_int4_linear_refuses_codes_laid_out_for_other_columns() -> None:
    weight = QuantizedWeight.quantize(torch.randn(8, 64), 4)
    packed = kernels().int4_pack(weight.codes, weight.scales, weight.zeros)
    with pytest.raises(RuntimeError, match="int4_pack lays them out"):
        kernels().int4_linear(torch.zeros(1, 128), *packed)


@pytest.mark.parametrize("qkv_dtype", native.DTYPES, ids=str)
@pytest.mark.parametrize("cache_dtype", native.DTYPES, ids=str)
def test_rotary_to_cache_rotates_as_transformers_and_writes_keys_and_values_at_their_slots(
        qkv_dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    rows, head_dim = 5, 64
    qkv = torch.randn(rows, HEADS + 2 * KV_HEADS, head_dim).to(qkv_dtype)
    angles = torch.randn(rows, head_dim // 2) * 100
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    k_cache = torch.zeros(SLOTS, KV_HEADS, head_dim, dtype=cache_dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([7, 0, 299, 42, 8])
    queries = kernels().rotary_to_cache(qkv, cos, sin, k_cache, v_cache, slots, HEADS, KV_HEADS)
    exact = qkv.float()
    expected_q, expected_k = apply_rotary_pos_emb(  # cos and sin broadcast over the heads
        exact[:, :HEADS], exact[:, HEADS:HEADS + KV_HEADS], cos, sin)
    tolerance = 1e-5 if cache_dtype == torch.float32 else 1e-2
    assert queries.dtype == cache_dtype and queries.shape == (rows, HEADS, head_dim)
    torch.testing.assert_close(queries.float(), expected_q, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(k_cache[slots].float(), expected_k, rtol=tolerance,
                               atol=tolerance)
    torch.testing.assert_close(v_cache[slots].float(), exact[:, HEADS + KV_HEADS:],
                               rtol=tolerance, atol=tolerance)
    untouched = torch.ones(SLOTS, dtype=torch.bool)
    untouched[slots] = False
    assert not k_cache[untouched].any() and not v_cache[untouched].any()


@pytest.mark.parametrize("slot", [SLOTS, -1], ids=["past-the-cache", "negative"])
def test_rotary_to_cache_refuses_to_write_outside_the_caches(slot: int) -> None:
    caches = torch.zeros(SLOTS, KV_HEADS, 8)
    with pytest.raises(RuntimeError, match="outside the caches"):
        kernels().rotary_to_cache(torch.zeros(1, HEADS + 2 * KV_HEADS, 8), torch.ones(1, 8),
                                  torch.zeros(1, 8), caches, caches.clone(),
                                  torch.tensor([slot]), HEADS, KV_HEADS)


@pytest.mark.parametrize("dtype", native.DTYPES, ids=str)
def test_silu_mul_is_silu_of_the_gate_times_the_up_projection_as_pytorch_rounds_them(
        dtype: torch.dtype) -> None:
    """Gates far past where e^x under- or overflows included; in bf16 the same bits as
    PyTorch's silu and product, each rounded to bf16, but where PyTorch's silu is -0 and ours
    a denormal-sized product (the exp differs in float32's last bits, which these gates' bf16
    results do not show)."""
    torch.manual_seed(0)
    gate_up = torch.randn(9, 2 * 100) * 5
    gate_up[0, :4] = torch.tensor([-1000.0, -90.0, 90.0, 1000.0])
    gate_up = gate_up.to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    expected = F.silu(gate) * up
    out = kernels().silu_mul(gate_up)
    assert out.dtype == dtype and out.shape == (9, 100)
    exact = dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, rtol=0 if exact else 1e-6,
                               atol=1e-30 if exact else 1e-6)
