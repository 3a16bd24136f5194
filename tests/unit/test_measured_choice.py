"""The load-time choice between two ways of computing the same thing picks the faster."""

from __future__ import annotations

import torch

from engine.measured_choice import MeasuredChoice


def slow(x: torch.Tensor) -> torch.Tensor:
    weight = torch.ones(x.shape[1], x.shape[1])
    for _ in range(200):
        x = x @ weight / x.shape[1]
    return x


def fast(x: torch.Tensor) -> torch.Tensor:
    return x


def test_the_faster_way_is_chosen_for_every_number_of_rows() -> None:
    rows = (1, 3, 16, 64, 300, 5000)
    assert all(MeasuredChoice().measure(slow, fast, 64).second_is_faster(n) for n in rows)
    assert not any(MeasuredChoice().measure(fast, slow, 64).second_is_faster(n) for n in rows)
    assert not any(MeasuredChoice().second_is_faster(n) for n in rows)
    assert all(MeasuredChoice.second_always().second_is_faster(n) for n in rows)
