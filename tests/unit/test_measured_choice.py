"""The load-time choice between ways of computing the same thing picks the fastest."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from switchboard.engine import attention, measured_choice, native
from switchboard.engine.measured_choice import MeasuredChoice, fastest_overall
from switchboard.engine.paged_runner import PagedRunner, SequenceChunk, measured_layers
from switchboard.engine.timing_store import SETTLED_MEASUREMENTS, TimingStore


def slow(x: torch.Tensor, products: int = 200) -> torch.Tensor:
    weight = torch.ones(x.shape[1], x.shape[1])
    for _ in range(products):
        x = x @ weight / x.shape[1]
    return x


medium = partial(slow, products=20)


def fast(x: torch.Tensor) -> torch.Tensor:
    return x


def test_the_faster_way_is_chosen_for_every_number_of_rows() -> None:
    rows = (1, 3, 16, 64, 300, 5000)
    assert all(MeasuredChoice().measure(slow, fast, 64).second_is_faster(n) for n in rows)
    assert not any(MeasuredChoice().measure(fast, slow, 64).second_is_faster(n) for n in rows)
    assert not any(MeasuredChoice().second_is_faster(n) for n in rows)
    assert all(MeasuredChoice.second_always().second_is_faster(n) for n in rows)


def test_a_choice_for_all_rows_at_once_picks_the_fastest_overall() -> None:
    assert fastest_overall([lambda: slow, lambda: fast], 64) == 1
    assert fastest_overall([lambda: fast, lambda: slow], 64) == 0
    assert fastest_overall([lambda: slow, lambda: slow, lambda: fast, lambda: slow], 64) == 2


def test_a_spell_of_load_during_one_turn_does_not_decide() -> None:
    """Each product is made afresh for each of its two turns, one held at a time; a product
    slowed in one turn only (here the first) is judged by the other."""
    made: list[str] = []

    def loaded_then_idle() -> measured_choice.Product:
        made.append("loaded_then_idle")
        return slow if len(made) == 1 else fast

    def steady() -> measured_choice.Product:
        made.append("steady")
        return medium

    assert fastest_overall([loaded_then_idle, steady], 64) == 0
    assert made == ["loaded_then_idle", "steady", "steady", "loaded_then_idle"]


@pytest.mark.parametrize("second_fast_at", [(), (1,), (1, 4), (4, 16)])
def test_a_choice_timed_in_turns_follows_the_faster_arrangement_at_each_probed_row(
        second_fast_at: tuple[int, ...]) -> None:
    """As the runner times whole steps two ways: each arrangement is set up before the
    product runs under it, turn by turn; rows not probed keep the first way."""
    arranged: list[str] = []

    def product(rows: int) -> torch.Tensor:
        second_fast = (arranged[-1] == "second") == (rows in second_fast_at)
        return fast(torch.ones(1, 64)) if second_fast else slow(torch.ones(1, 64))

    choice = MeasuredChoice().measure_in_turns(
        partial(arranged.append, "first"), partial(arranged.append, "second"), product,
        {rows: rows for rows in (1, 4, 16)}, rounds=2)
    assert arranged == ["first", "second"] * 3 * 3
    assert [choice.second_is_faster(rows) for rows in (1, 2, 4, 9, 16, 17, 300)] == [
        rows in second_fast_at for rows in (1, 4, 4, 16, 16, 64, 256)]
    assert choice.second_never_faster == (not second_fast_at)


def test_timing_covers_the_first_128_mib_of_layers_and_at_least_one() -> None:
    up_projection = 1536 * 576 * 4  # SmolLM2's, float32: its 30 layers are 106 MB
    assert measured_layers(list(range(30)), lambda _: up_projection) == list(range(30))
    assert measured_layers(list(range(16)), lambda _: 64 * 2**20) == [0, 1]
    assert measured_layers([7], lambda _: 2**40) == [7]


def test_bf16_is_never_chosen_where_onednn_multiplies_no_bf16(monkeypatch) -> None:
    """An AVX2-only CPU (AMD's Zen 3): oneDNN refuses to lay out a bf16 weight there, so a
    quantized server must not try (it failed to start)."""
    monkeypatch.setattr(measured_choice, "onednn_multiplies_bf16", lambda: False)
    monkeypatch.setattr(measured_choice, "prepack_bf16", refuse_bf16)
    assert not measured_choice.bf16_is_faster(torch.randn(256, 128))


def refuse_bf16(weight: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support "
                       "avx_ne_convert or avx512bw, avx512vl and avx512dq")


def test_onednn_caches_are_capped_unless_the_operator_set_them(monkeypatch) -> None:
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "500")
    measured_choice.limit_onednn_caches()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(
        measured_choice.ONEDNN_CACHED_PRODUCTS)
    assert os.environ["LRU_CACHE_CAPACITY"] == "500"


@pytest.mark.parametrize("faster", list(attention.DecodeAttention),
                         ids=lambda form: form.name.lower())
def test_decoding_sequences_attend_in_the_form_timed_faster_at_the_warm_up(
        faster: attention.DecodeAttention, monkeypatch) -> None:
    """SDPA's enable_gqa, query heads grouped by the K/V head they share, or the native
    kernel: which is fastest depends on the processor and the KV dtype (grouped: 2-5x faster
    than SDPA's GQA in bf16 on an AMD Zen 5, 4% slower on an Intel Xeon with AMX). The
    runner's steps use the form its warm-up timed fastest; here the others are slowed."""
    assert native.kernels() is not None, "the native kernels did not build"
    forms = attention.DecodeAttention
    calls = dict.fromkeys(forms, 0)

    def counted(form: attention.DecodeAttention, attend):
        def attend_and_count(*args: object, **kwargs: object) -> torch.Tensor:
            if form is not forms.SDPA or kwargs.get("enable_gqa"):
                calls[form] += 1
                if form is not faster:
                    slow(torch.ones(1, 64))
            return attend(*args, **kwargs)
        return attend_and_count

    monkeypatch.setattr(attention, "_attend_grouped",
                        counted(forms.GROUPED, attention._attend_grouped))
    monkeypatch.setattr(attention, "_attend_natively",
                        counted(forms.NATIVE, attention._attend_natively))
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        counted(forms.SDPA, F.scaled_dot_product_attention))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, architectures=["LlamaForCausalLM"]))
    runner = PagedRunner(model.eval(), torch.device("cpu"), num_blocks=64, block_size=4)
    runner.warm_up()
    calls.update(dict.fromkeys(calls, 0))
    runner.execute([SequenceChunk(str(row), [row], 9, [3 * row, 3 * row + 1, 3 * row + 2],
                                  samples=True) for row in range(3)])
    assert calls == {form: 2 if form is faster else 0 for form in forms}  # one call a layer


HOG_SECONDS = 300  # an upper bound: the hogs are stopped as soon as the warm-up is done


def spinning_processes(count: int) -> list[subprocess.Popen]:
    """Busy processes, one per core, that stop by themselves after HOG_SECONDS."""
    spin = f"import time\nend = time.monotonic() + {HOG_SECONDS}\nwhile time.monotonic() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(count)]


def test_a_warm_up_beside_a_cpu_hog_chooses_as_the_idle_warm_ups_did(tmp_path: Path) -> None:
    """Load-time choices keep their best times in the cache folder: once starts have settled
    them, a warm-up while busy processes hold every core reuses them, where its own timings
    could have chosen a much slower path for the server's whole life
    (docs/performance-defaults.md)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, architectures=["LlamaForCausalLM"])).eval()
    store = TimingStore(tmp_path)

    def warm_up() -> dict[str, str]:
        runner = PagedRunner(copy.deepcopy(model), torch.device("cpu"), num_blocks=64,
                             block_size=4, timings=store)
        runner.warm_up()
        return runner.measured_choices()

    kept = None
    for _ in range(3 * SETTLED_MEASUREMENTS):  # each choice settles after the one before it
        idle = warm_up()
        if store.file.read_text() == kept:
            break
        kept = store.file.read_text()
    assert store.file.read_text() == kept, "the kept timings did not settle"
    hogs = spinning_processes(os.cpu_count() or 2)
    try:
        assert warm_up() == idle
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert store.file.read_text() == kept
