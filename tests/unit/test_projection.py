"""The runner's projections: both forms of the product give nn.Linear's result, whichever one
the load-time measurement picks for a number of rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.measured_choice import MeasuredChoice
from engine.paged_runner import Projection


@pytest.mark.parametrize("rows", [1, 3, 20, 70])
@pytest.mark.parametrize("transposed", [None, MeasuredChoice.second_always()],
                         ids=["plain", "transposed"])
def test_a_projection_equals_nn_linear_in_either_form(rows: int,
                                                      transposed: MeasuredChoice | None) -> None:
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(48, 32, generator=generator)
    bias = torch.randn(48, generator=generator)
    x = torch.randn(rows, 32, generator=generator)
    projection = Projection(weight, bias, transposed)
    torch.testing.assert_close(projection(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)

