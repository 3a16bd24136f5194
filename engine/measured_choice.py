"""Choices between two ways of computing the same product whose speeds depend on the
processor, by much either way, measured once at load for a few numbers of rows.

The form (W @ xᵀ)ᵀ beats nn.Linear's x @ Wᵀ at some numbers of rows on some processors and
loses on others; PyTorch's int4 kernel falls behind dequantised float32 matmul, or a bf16
copy, from a number of rows that differs by processor
(docs/engine-measurements.md#cpu-matmul-layouts, docs/engine-measurements.md#quantization).

Products are timed over many layers' weights, as a step reads them: timed on one weight kept
hot in cache, a bf16 copy seemed to win at rows where, read from memory, it lost
(docs/engine-measurements.md#how-choices-are-timed).

A float32 weight can also be laid out once for a packed GEMM, instead of at every product as
MKL's plain GEMM does, by MKL (`MklPacked`) or by oneDNN (`OneDnnPacked`): which of them
wins, if either, depends on the processor
(docs/engine-measurements.md#packed-float32-weights). The plain and a packed form cannot both
be kept (the weights would take twice the memory), so that choice is made once for all rows
(`fastest_overall`).

Every choice is made from the times a `Best` gives: by default this start's own, or the best
kept over starts in the cache folder (see `timing_store.py`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import TypeVar

import torch
import torch.nn.functional as F

from switchboard.engine.timing_store import Best, Times, TimingStore, measure_now

PROBE_ROWS = (1, 4, 8, 16, 64, 256)
REPEATS = 5
# `fastest_overall` times each product in two turns of a warm-up run and this many: as many
# runs in all as one turn of REPEATS.
REPEATS_PER_TURN = 2
# The rows oneDNN lays a bf16 weight out for; measured near the best from 1 to 64 rows
# (docs/engine-measurements.md#packed-float32-weights).
BF16_BATCH_HINT = 16
# The rows MKL and oneDNN lay a float32 weight out for (they compute any number of rows from
# it): for each, measured the best or near it at every number of rows probed
# (docs/engine-measurements.md#packed-float32-weights).
FP32_BATCH_HINT = 64
# The most rows one oneDNN product is given (see `OneDnnPacked`).
ONEDNN_MAX_ROWS = 256
# The products oneDNN (and ideep, PyTorch's layer over it) keep ready, each for one weight shape
# and number of rows, each with its own scratch memory. Their default, 1024 each, let a server
# under varied load grow; 32 kept most of that back, as fast, since a product made anew is
# cheap (docs/engine-measurements.md#onednns-caches).
ONEDNN_CACHED_PRODUCTS = 32

Product = Callable[[torch.Tensor], torch.Tensor]
Input = TypeVar("Input")


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

    def measure(self, first: Product, second: Product, in_features: int,
                best: Best = measure_now) -> MeasuredChoice:
        """first, second: the same function of x [rows, in_features] (float32), two ways;
        best: the times to choose by (see `timing_store.py`)."""
        inputs = [torch.randn(rows, in_features) for rows in PROBE_ROWS]

        def measure() -> Times:
            times: Times = [[], []]
            for x in inputs:
                times[1].append(_seconds(second, x))
                times[0].append(_seconds(first, x))
            return times

        self._choose(PROBE_ROWS, best(measure))
        return self

    def measure_in_turns(self, first: Callable[[], object], second: Callable[[], object],
                         product: Callable[[Input], object], inputs: dict[int, Input],
                         rounds: int, best: Best = measure_now) -> MeasuredChoice:
        """first, second: arrangements under which `product` runs two ways; inputs: one for
        each of some of PROBE_ROWS (the others keep the first way). See `fastest_in_turns`."""
        def measure() -> Times:
            per_rows = [times_in_turns((first, second), product, [x], rounds)
                        for x in inputs.values()]
            return [[times[way][0] for times in per_rows] for way in (0, 1)]

        self._choose(inputs, best(measure))
        return self

    def _choose(self, probes: Iterable[int], times: Times) -> None:
        for rows, first, second in zip(probes, *times, strict=True):
            self._second_faster[rows] = second < first

    def describe(self) -> str:
        """The numbers of rows probed for which the second way was faster, for the log."""
        return ", ".join(str(rows) for rows, faster in self._second_faster.items()
                         if faster) or "none"

    @property
    def second_always_faster(self) -> bool:
        """Whether the second way was faster at every number of rows measured."""
        return all(self._second_faster.values())

    @property
    def second_never_faster(self) -> bool:
        """Whether the first way was faster at every number of rows measured."""
        return not any(self._second_faster.values())

    def second_is_faster(self, rows: int) -> bool:
        """As measured for the nearest probe at or above `rows` (the largest past them)."""
        probe = next((probe for probe in PROBE_ROWS if rows <= probe), PROBE_ROWS[-1])
        return self._second_faster[probe]


def fastest_overall(makers: Sequence[Callable[[], Product]], in_features: int,
                    best: Best = measure_now) -> int:
    """The index of the fastest of the products `makers` make, over PROBE_ROWS, by the
    geometric mean of its times (each number of rows counts alike, however long it takes).
    Each product is made, timed over all rows and dropped before the next is made (one held
    at a time), in two passes, the second in reverse order, its best time of both kept at
    each number of rows: a spell of load on the machine while one product is timed then
    decides nothing unless it spans both of its turns. Timed once each, a layout that wins
    overall on a quiet machine came out the loser in a bench run under load
    (docs/engine-measurements.md#how-choices-are-timed)."""
    inputs = [torch.randn(rows, in_features) for rows in PROBE_ROWS]

    def measure() -> Times:
        fastest = [[math.inf] * len(inputs) for _ in makers]
        order = range(len(makers))
        for index in (*order, *reversed(order)):
            product = makers[index]()
            fastest[index] = [min(seconds, _seconds(product, x, REPEATS_PER_TURN))
                              for seconds, x in zip(fastest[index], inputs)]
            del product  # before the next is made
        return fastest

    return _least_geometric_mean(best(measure))


def fastest_in_turns(arrangements: Sequence[Callable[[], object]],
                     product: Callable[[Input], object], inputs: Sequence[Input],
                     rounds: int, best: Best = measure_now) -> int:
    """The index of the arrangement under which `product` is fastest over `inputs`, by the
    geometric mean of its times (see `times_in_turns`)."""
    return _least_geometric_mean(best(partial(times_in_turns, arrangements, product, inputs,
                                              rounds)))


def times_in_turns(arrangements: Sequence[Callable[[], object]],
                   product: Callable[[Input], object], inputs: Sequence[Input],
                   rounds: int) -> Times:
    """The times of `product` over `inputs` under each arrangement, each the best of `rounds`
    after one to warm up. The arrangements take turns round by round, so a spell of load on
    the machine slows them alike (timed one after another, whole steps of a model differed from
    one run to the next: docs/engine-measurements.md#how-choices-are-timed)."""
    fastest = [[math.inf] * len(inputs) for _ in arrangements]
    for round_ in range(rounds + 1):
        for times, arrange in zip(fastest, arrangements):
            arrange()
            for index, x in enumerate(inputs):
                start = time.perf_counter()
                product(x)
                if round_:
                    times[index] = min(times[index], time.perf_counter() - start)
    return fastest


def _least_geometric_mean(times: Sequence[Sequence[float]]) -> int:
    """The index of the series of times whose geometric mean is least."""
    log_times = [sum(map(math.log, series)) for series in times]
    return log_times.index(min(log_times))


def one_after_another(products: Sequence[Product]) -> Product:
    """The products run in turn on the same x, as a step runs its layers; the last result."""
    def run(x: torch.Tensor) -> torch.Tensor:
        for product in products:
            y = product(x)
        return y
    return run


def transposed_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weightᵀ computed as (weight @ xᵀ)ᵀ. A lone row is one product per thread, each over
    its slice of the weight's rows: faster than the matrix-vector product (which runs on one
    thread), than the row doubled into two, and than nn.Linear's x @ Wᵀ
    (docs/engine-measurements.md#cpu-matmul-layouts)."""
    rows = x.shape[0]
    slices = torch.get_num_threads()
    if rows == 1 and weight.shape[0] % slices == 0:
        return torch.bmm(weight.view(slices, -1, weight.shape[1]),
                         x.t().expand(slices, -1, -1)).view(1, -1)
    if rows == 1:
        x = torch.cat((x, x))
    return (weight @ x.t()).t()[:rows].contiguous()


def _seconds(product: Product, x: torch.Tensor, repeats: int = REPEATS) -> float:
    """The fastest of a few runs, after one to warm up."""
    product(x)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        product(x)
        best = min(best, time.perf_counter() - start)
    return best


def limit_onednn_caches() -> None:
    """Cap oneDNN's and ideep's caches of ready products at ONEDNN_CACHED_PRODUCTS, unless the
    operator set them. Both read their setting once, at their first product: call this before
    any oneDNN product runs in the process (it does nothing after)."""
    for variable in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(variable, str(ONEDNN_CACHED_PRODUCTS))


def onednn_multiplies_bf16() -> bool:
    """Whether oneDNN multiplies bf16 on this CPU: it needs AVX-512 (BW, VL and DQ) or
    AVX-NE-CONVERT. Without them (an AVX2 CPU such as AMD's Zen 3) laying out a bf16 weight
    for it fails."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def bf16_is_faster(weight: torch.Tensor, store: TimingStore = TimingStore(None)) -> bool:
    """Whether this CPU multiplies 64 rows by a oneDNN-prepacked bf16 copy of `weight`
    [out, in] faster than in fp32: much faster with AMX, much slower without bf16 units, and
    not at all without oneDNN's bf16 support (docs/engine-measurements.md#quantization)."""
    if not onednn_multiplies_bf16():
        return False
    packed = prepack_bf16(weight)
    name = f"float32 or a bf16 copy, {tuple(weight.shape)}, rows {PROBE_ROWS}"
    choice = MeasuredChoice().measure(partial(F.linear, weight=weight),
                                      partial(bf16_product, packed=packed), weight.shape[1],
                                      partial(store.best, name))
    return choice.second_is_faster(64)


def prepack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] as a bf16 copy laid out for oneDNN's matmul (opaque: only
    `bf16_product` reads it)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16), BF16_BATCH_HINT)


def bf16_product(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x @ weightᵀ in bf16, with `packed` from `prepack_bf16`."""
    return onednn_product(x.to(torch.bfloat16), packed)


def onednn_product(x: torch.Tensor, packed: torch.Tensor,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weightᵀ (+ bias) by oneDNN, from a weight laid out by `_reorder_linear_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class MklPacked:
    """x @ weightᵀ (+ bias) from a float32 weight [out, in] laid out for MKL's packed GEMM (the
    unpacked weight is not kept)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self._packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, FP32_BATCH_HINT)
        # Any tensor of the weight's shape (an expanded scalar takes no memory): MKL computes
        # from the packed layout when told x's rows are the rows it was packed for, and would
        # read the unpacked weight only otherwise.
        self._shape = weight.new_zeros(()).expand(weight.shape)

    @staticmethod
    def is_available() -> bool:
        return torch.backends.mkl.is_available()

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.ops.mkl._mkl_linear(x, self._packed, self._shape, bias, x.shape[0])


class OneDnnPacked:
    """x @ weightᵀ (+ bias) from a float32 weight [out, in] laid out for oneDNN's matmul (the
    unpacked weight is not kept).

    oneDNN keeps state for each number of rows it has multiplied (see `limit_onednn_caches`),
    and more for more rows, which past a few hundred rows a server would see as memory growing
    with each new prompt length (docs/engine-measurements.md#onednns-caches). More rows than
    ONEDNN_MAX_ROWS are multiplied that many at a time (long prompt chunks were slower than
    with MKL's plain GEMM either way: docs/engine-measurements.md#packed-float32-weights)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, FP32_BATCH_HINT)

    @staticmethod
    def is_available() -> bool:
        return torch.backends.mkldnn.is_available()

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[0] <= ONEDNN_MAX_ROWS:
            return onednn_product(x, self._packed, bias)
        return torch.cat([onednn_product(rows, self._packed, bias)
                          for rows in x.split(ONEDNN_MAX_ROWS)])


FP32_PACKINGS = (MklPacked, OneDnnPacked)
