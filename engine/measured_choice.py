"""Choices between two ways of computing the same product whose speeds depend on the
processor, by up to 3x either way, measured once at load for a few numbers of rows.

Measured over SmolLM2's weights on 2 cores: the form (W @ xᵀ)ᵀ beat nn.Linear's x @ Wᵀ by
2.3x with 4 rows on an AMD Zen 3 (AVX2) and lost by 3x with 1 row on an Intel Xeon with
AVX-512; PyTorch's int4 kernel fell behind dequantised float32 matmul from about 12 rows on
the first, and behind a bf16 copy (AMX) between 8 and 16 rows on the second (a step of 5 to 8
rows, as verifying speculated tokens gives, took 32 ms on the copy and 28 with the int4
kernel, before 8 was probed).

Products are timed over many layers' weights, as a step reads them: timed on one weight kept
hot in cache, that bf16 copy seemed to win from 4 rows, where from memory it lost by 2x.

A float32 weight can also be laid out once for MKL's packed GEMM (`prepack_fp32`), instead of
at every product as MKL's plain GEMM does: on the Xeon, SmolLM2's layers took 26-28% less
time from 4 to 64 rows and as long at 1 or 2. Both forms cannot be kept (the weights would
take twice the memory), so that choice is made once for all rows (`faster_overall`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F

PROBE_ROWS = (1, 4, 8, 16, 64, 256)
REPEATS = 5
# The rows oneDNN lays a bf16 weight out for; measured within 5% of the best at 1 to 64 rows.
BF16_BATCH_HINT = 16
# The rows MKL lays a float32 weight out for (it computes any number of rows from it): on the
# Xeon the best of 8 to 128 at 64 rows and beyond, and within 2% of the best below.
FP32_BATCH_HINT = 64

Product = Callable[[torch.Tensor], torch.Tensor]


class MeasuredChoice:
    """Unmeasured, the first way for every number of rows, until `measure`."""

    def __init__(self) -> None:
        self._second_faster = dict.fromkeys(PROBE_ROWS, False)

    @classmethod
    def first_always(cls) -> MeasuredChoice:
        return cls()

    @classmethod
    def second_always(cls) -> MeasuredChoice:
        choice = cls()
        choice._second_faster = dict.fromkeys(PROBE_ROWS, True)
        return choice

    def measure(self, first: Product, second: Product, in_features: int) -> MeasuredChoice:
        """first, second: the same function of x [rows, in_features] (float32), two ways."""
        for rows in PROBE_ROWS:
            x = torch.randn(rows, in_features)
            self._second_faster[rows] = _seconds(second, x) < _seconds(first, x)
        return self

    def second_is_faster(self, rows: int) -> bool:
        """As measured for the nearest probe at or above `rows` (the largest past them)."""
        probe = next((probe for probe in PROBE_ROWS if rows <= probe), PROBE_ROWS[-1])
        return self._second_faster[probe]


def faster_overall(first: Product, second: Product, in_features: int) -> bool:
    """Whether `second` is faster than `first` over PROBE_ROWS, by the geometric mean of
    their time ratios (each number of rows counts alike, however long it takes)."""
    log_ratio = 0.0
    for rows in PROBE_ROWS:
        x = torch.randn(rows, in_features)
        log_ratio += math.log(_seconds(second, x) / _seconds(first, x))
    return log_ratio < 0


def one_after_another(products: Sequence[Product]) -> Product:
    """The products run in turn on the same x, as a step runs its layers; the last result."""
    def run(x: torch.Tensor) -> torch.Tensor:
        for product in products:
            y = product(x)
        return y
    return run


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


def onednn_multiplies_bf16() -> bool:
    """Whether oneDNN multiplies bf16 on this CPU: it needs AVX-512 (BW, VL and DQ) or
    AVX-NE-CONVERT. Without them (an AVX2 CPU such as AMD's Zen 3) laying out a bf16 weight
    for it fails."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def bf16_is_faster(weight: torch.Tensor) -> bool:
    """Whether this CPU multiplies 64 rows by a oneDNN-prepacked bf16 copy of `weight`
    [out, in] faster than in fp32: 4-5x faster with AMX, 5x slower without bf16 units, and not
    at all without oneDNN's bf16 support."""
    if not onednn_multiplies_bf16():
        return False
    packed = prepack_bf16(weight)
    choice = MeasuredChoice().measure(partial(F.linear, weight=weight),
                                      partial(bf16_product, packed=packed), weight.shape[1])
    return choice.second_is_faster(64)


def prepack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] as a bf16 copy laid out for oneDNN's matmul (opaque: only
    `bf16_product` reads it)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16), BF16_BATCH_HINT)


def bf16_product(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x @ weightᵀ in bf16, with `packed` from `prepack_bf16`."""
    return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), packed, None, "none", [], "")


def prepack_fp32(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] (float32) laid out for MKL's packed GEMM (opaque: only
    `fp32_packed_product` reads it), where `torch.backends.mkl.is_available()`."""
    return torch.ops.mkl._mkl_reorder_linear_weight(weight, FP32_BATCH_HINT)


def fp32_packed_product(x: torch.Tensor, packed: torch.Tensor, shape: torch.Tensor,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weightᵀ (+ bias), with `packed` from `prepack_fp32`. `shape`: a tensor of the
    weight's shape, of any content (an expanded scalar takes no memory): MKL computes from
    the packed layout when told x's rows are the rows it was packed for, and would read the
    unpacked weight only otherwise."""
    return torch.ops.mkl._mkl_linear(x, packed, shape, bias, x.shape[0])
