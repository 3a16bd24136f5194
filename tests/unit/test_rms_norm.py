"""The runner's RMSNorm gives transformers' LlamaRMSNorm result, however it computes it (on a
CPU in float32 by the native kernel, or, for a head's norm over [tokens, heads, head size], as
a layer norm over (x, −x)), and so does its sum with the residual stream."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from switchboard.engine.paged_runner import RMSNorm


def norm_and_rows(dtype: torch.dtype) -> tuple[LlamaRMSNorm, torch.Tensor]:
    """transformers' norm of 576 with random weights, and float32 rows of very different
    scales, one of zeros (where eps alone keeps it finite)."""
    generator = torch.Generator().manual_seed(0)
    module = LlamaRMSNorm(576, eps=1e-5)
    with torch.no_grad():
        module.weight.copy_(torch.randn(576, generator=generator))
    x = torch.randn(5, 576, generator=generator) * torch.tensor([[1e-4], [1e-2], [1.0], [30.0],
                                                                 [0.0]])
    return module.to(dtype), x


def expected_norm(module: LlamaRMSNorm, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return module(x.to(module.weight.dtype) if module.weight.dtype != torch.float32 else x)


def assert_close(ours: torch.Tensor, expected: torch.Tensor) -> None:
    assert ours.dtype == expected.dtype
    tolerance = 1e-5 if ours.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours.float(), expected.float(), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("heads", [None, 3], ids=["rows", "heads"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_transformers(dtype: torch.dtype, heads: int | None) -> None:
    module, x = norm_and_rows(dtype)
    if heads is not None:  # a head's norm (Qwen3's), over each of a token's heads
        x = x.view(-1, 1, 576).expand(-1, heads, -1)
    assert_close(RMSNorm(module)(x), expected_norm(module, x))


@pytest.mark.parametrize("delta_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_layers_output_added_to_the_residual_stream_is_normed_as_transformers_norms_it(
        dtype: torch.dtype, delta_dtype: torch.dtype) -> None:
    module, x = norm_and_rows(dtype)
    delta = torch.randn(x.shape).to(delta_dtype)
    total = x + delta.float()
    residual, normed = RMSNorm(module).add(x.clone(), delta)
    torch.testing.assert_close(residual, total, rtol=0, atol=0)
    assert_close(normed, expected_norm(module, total))
