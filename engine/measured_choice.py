"""Choices between two ways of computing the same product whose speeds depend on the
processor, by up to 3x either way, measured once at load for a few numbers of rows.

Measured over SmolLM2's weights on 2 cores: the form (W @ xᵀ)ᵀ beat nn.Linear's x @ Wᵀ by
2.3x with 4 rows on an AMD Zen 3 (AVX2) and lost by 3x with 1 row on an Intel Xeon with
AVX-512; PyTorch's int4 kernel fell behind dequantised float32 matmul from about 12 rows on
the first and from about 128 on the second.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

PROBE_ROWS = (1, 4, 16, 64, 256)
REPEATS = 7

Product = Callable[[torch.Tensor], torch.Tensor]


class MeasuredChoice:
    def __init__(self, first: Product, second: Product, in_features: int) -> None:
        """first, second: the same function of x [rows, in_features] (float32), two ways."""
        self._second_faster = {}
        for rows in PROBE_ROWS:
            x = torch.randn(rows, in_features)
            self._second_faster[rows] = _seconds(second, x) < _seconds(first, x)

    @classmethod
    def first_always(cls) -> MeasuredChoice:
        return cls._fixed(second=False)

    @classmethod
    def second_always(cls) -> MeasuredChoice:
        return cls._fixed(second=True)

    @classmethod
    def _fixed(cls, *, second: bool) -> MeasuredChoice:
        choice = cls.__new__(cls)
        choice._second_faster = dict.fromkeys(PROBE_ROWS, second)
        return choice

    def second_is_faster(self, rows: int) -> bool:
        """As measured for the nearest probe at or above `rows` (the largest past them)."""
        probe = next((probe for probe in PROBE_ROWS if rows <= probe), PROBE_ROWS[-1])
        return self._second_faster[probe]


def transposed_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weightᵀ computed as (weight @ xᵀ)ᵀ, a lone row as two."""
    rows = x.shape[0]
    if rows == 1:
        x = torch.cat((x, x))
    return (weight @ x.t()).t()[:rows].contiguous()


def _seconds(product: Product, x: torch.Tensor) -> float:
    """The fastest of a few runs, after one to warm up."""
    product(x)
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        product(x)
        best = min(best, time.perf_counter() - start)
    return best
