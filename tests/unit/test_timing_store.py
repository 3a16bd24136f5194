"""Load-time timings kept across restarts: each product's best time, so a start on a busy
machine decides with an earlier, quieter start's times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from switchboard.engine import timing_store
from switchboard.engine.measured_choice import PROBE_ROWS, MeasuredChoice, fastest_overall
from switchboard.engine.timing_store import SETTLED_MEASUREMENTS, Times, TimingStore

QUIET = [[1.0, 2.0], [3.0, 1.0]]
BUSY = [[5.0, 0.5], [6.0, 6.0]]


def never() -> Times:
    raise AssertionError("timed again although the kept times were settled")


def test_a_busy_start_keeps_each_products_quieter_time(tmp_path: Path) -> None:
    assert TimingStore(tmp_path).best("product", lambda: QUIET) == QUIET
    # Another server process on the same machine reads what the first kept.
    assert TimingStore(tmp_path).best("product", lambda: BUSY) == [[1.0, 0.5], [3.0, 1.0]]


def test_settled_times_are_reused_without_timing(tmp_path: Path) -> None:
    store = TimingStore(tmp_path)
    for _ in range(SETTLED_MEASUREMENTS):
        store.best("product", lambda: QUIET)
    assert store.best("product", never) == QUIET
    assert store.best("another product", lambda: BUSY) == BUSY


def test_times_are_kept_per_processor_and_torch_version(tmp_path: Path, monkeypatch) -> None:
    for _ in range(SETTLED_MEASUREMENTS):
        TimingStore(tmp_path).best("product", lambda: QUIET)
    identity = timing_store.processor_identity()
    monkeypatch.setattr(timing_store, "processor_identity",
                        lambda: {**identity, "torch": "0.0.1"})
    assert TimingStore(tmp_path).best("product", lambda: BUSY) == BUSY


def test_a_changed_number_of_probes_starts_over(tmp_path: Path) -> None:
    store = TimingStore(tmp_path)
    store.best("product", lambda: QUIET)
    assert store.best("product", lambda: [[9.0], [8.0]]) == [[9.0], [8.0]]


def damaged_entries(text: str, damage: dict) -> str:
    document = json.loads(text)
    document["entries"] = dict.fromkeys(document["entries"], damage)
    return json.dumps(document)


@pytest.mark.parametrize("damage", [
    lambda text: "{not json",
    lambda text: damaged_entries(text, {"times": 3}),
    lambda text: damaged_entries(text, {"measurements": 9, "times": [["a"]]}),
])
def test_a_damaged_file_is_measured_over(tmp_path: Path, damage) -> None:
    store = TimingStore(tmp_path)
    for _ in range(SETTLED_MEASUREMENTS):
        store.best("product", lambda: BUSY)
    store.file.write_text(damage(store.file.read_text()))
    assert store.best("product", lambda: QUIET) == QUIET
    entries = json.loads(store.file.read_text())["entries"]
    assert [entry["times"] for entry in entries.values()] == [QUIET]


def test_a_folder_that_cannot_be_written_keeps_nothing_but_measures(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert TimingStore(blocked).best("product", lambda: QUIET) == QUIET
    assert TimingStore(None).best("product", lambda: BUSY) == BUSY


def test_choices_are_made_from_the_kept_times(tmp_path: Path) -> None:
    """A first start measured the second way faster at every probe; a later one, under
    load, measures it slower: the choice stays the quiet start's."""
    rows = len(PROBE_ROWS)
    quiet = [[2.0] * rows, [1.0] * rows]
    busy = [[2.0] * rows, [4.0] * rows]
    best = TimingStore(tmp_path).best
    assert MeasuredChoice().measure(abs, abs, 8, lambda m: best("m", lambda: quiet)) \
        .second_always_faster
    assert MeasuredChoice().measure(abs, abs, 8, lambda m: best("m", lambda: busy)) \
        .second_always_faster
    assert fastest_overall([lambda: abs, lambda: abs], 8,
                           lambda m: best("o", lambda: quiet)) == 1
    assert fastest_overall([lambda: abs, lambda: abs], 8,
                           lambda m: best("o", lambda: busy)) == 1
