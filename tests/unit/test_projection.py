"""The runner's projections: every form of the product gives nn.Linear's result, whichever one
the load-time measurement picks for a number of rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from switchboard.engine.measured_choice import FP32_PACKINGS, MeasuredChoice
from switchboard.engine.paged_runner import PackedProjection, Projection


@pytest.mark.parametrize("out_features", [48, 47])
@pytest.mark.parametrize("rows", [1, 3, 20, 64, 70, 300])
@pytest.mark.parametrize("form", ["plain", "transposed",
                                  *(packing.__name__ for packing in FP32_PACKINGS)])
def test_a_projection_equals_nn_linear_in_every_form(rows: int, form: str,
                                                     out_features: int) -> None:
    """The packed forms (MKL's, oneDNN's) are computed from a layout made for 64 rows, for any
    number of rows, without the unpacked weight. The transposed form computes a lone row in
    one slice of the weight per thread, or doubled where the slices would be uneven."""
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(out_features, 32, generator=generator)
    bias = torch.randn(out_features, generator=generator)
    x = torch.randn(rows, 32, generator=generator)
    projection = Projection(weight.clone(), bias,
                            MeasuredChoice.second_always() if form == "transposed" else None)
    packing = next((p for p in FP32_PACKINGS if p.__name__ == form), None)
    if packing is not None:
        projection = PackedProjection(projection, packing)
    torch.testing.assert_close(projection(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
