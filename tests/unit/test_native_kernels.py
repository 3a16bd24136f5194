"""The native kernels (engine/csrc): decode attention against SDPA over gathered keys and
values, at head sizes that take each of its vector widths and its scalar path, and its refusal
of inputs that would read outside the caches; the int4 product against the dequantised
weight. `make install` builds them: they must be there."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

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
