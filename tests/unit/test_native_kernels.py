"""The native decode-attention kernel (engine/csrc) against SDPA over gathered keys and values,
at head sizes that take each of its vector widths and its scalar path, and its refusal of
inputs that would read outside the caches. `make install` builds it: it must be there."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from switchboard.engine import native

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
