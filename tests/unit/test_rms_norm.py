"""The runner's RMSNorm gives transformers' LlamaRMSNorm result, however it computes it (on a
CPU in float32, as a layer norm over (x, −x))."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from switchboard.engine.paged_runner import RMSNorm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_transformers(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    module = LlamaRMSNorm(576, eps=1e-5)
    with torch.no_grad():
        module.weight.copy_(torch.randn(576, generator=generator))
    module = module.to(dtype)
    # Rows of very different scales, one of zeros (where eps alone keeps it finite).
    x = torch.randn(5, 576, generator=generator) * torch.tensor([[1e-4], [1e-2], [1.0], [30.0],
                                                                 [0.0]])
    with torch.no_grad():
        expected = module(x.to(dtype) if dtype != torch.float32 else x)
    ours = RMSNorm(module)(x)
    assert ours.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours.float(), expected.float(), rtol=tolerance, atol=tolerance)
