"""Load-time measurements (see `measured_choice.py`) kept across restarts in the cache folder,
per processor model, torch version and number of threads.

A choice timed while other work holds the cores can come out the other way, and then holds
for the server's whole life. Load only ever lengthens a time, so the store keeps each
product's best time over the starts that measured it, and choices are made from those: a
start on a busy machine adds slower times that change nothing where a quieter start measured
before. Once SETTLED_MEASUREMENTS starts have measured a choice, later starts take the kept
times without timing again (a restart under load then reuses the quiet measurement, and
starts sooner).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

# Starts that measure a choice before later ones reuse its kept times without timing.
SETTLED_MEASUREMENTS = 3
CPUINFO = Path("/proc/cpuinfo")
CPUINFO_FIELDS = ("model name", "cpu family", "model", "stepping")

# Seconds by way and probe: times[way][probe].
Times = list[list[float]]
Measure = Callable[[], Times]
# Gives the times a choice is made from: `measure`'s, or those kept (see TimingStore.best).
Best = Callable[[Measure], Times]


def measure_now(measure: Measure) -> Times:
    """The times of this measurement alone (nothing kept)."""
    return measure()


class TimingStore:
    """Best times of load-time measurements in `folder` (None: nothing kept, every start
    measures on its own)."""

    def __init__(self, folder: Path | None) -> None:
        self._file = (None if folder is None
                      else folder / "timings" / f"{_digest(processor_identity())}.json")

    @property
    def file(self) -> Path | None:
        return self._file

    def best(self, name: str, measure: Measure) -> Times:
        """The times to choose by for the measurement `name` (which says what is timed: the
        shapes, the ways, the probes): the kept ones once settled, else `measure`'s merged
        with the kept ones (each the fastest), and kept."""
        if self._file is None:
            return measure()
        key = f"{name}; {torch.get_num_threads()} threads"
        measurements, kept = _entry(self._read().get(key))
        if measurements >= SETTLED_MEASUREMENTS:
            return kept
        times = measure()
        if _same_shape(kept, times):
            times = [[min(a, b) for a, b in zip(ours, theirs)]
                     for ours, theirs in zip(times, kept)]
        else:
            measurements = 0
        measurements += 1
        # Read again: another server may have kept something since.
        self._write({**self._read(), key: {"measurements": measurements, "times": times}})
        return times

    def _read(self) -> dict[str, dict]:
        try:
            document = json.loads(self._file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            logger.warning("ignoring the kept timings in %s: %s", self._file, error)
            return {}
        entries = document.get("entries") if isinstance(document, dict) else None
        return entries if isinstance(entries, dict) else {}

    def _write(self, entries: dict[str, dict]) -> None:
        """Atomically (a server starting beside reads whole files only); a folder that cannot
        be written keeps nothing, with a warning: the server starts all the same."""
        document = {"processor": processor_identity(), "entries": entries}
        try:
            self._file.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self._file.parent, suffix=".tmp",
                                             delete=False) as staging:
                json.dump(document, staging, indent=1)
            os.replace(staging.name, self._file)
        except OSError as error:
            logger.warning("load-time timings cannot be kept in %s: %s", self._file, error)


def processor_identity() -> dict[str, str]:
    """What makes timings comparable: the processor model, the instruction set torch's
    kernels use on it, and torch's version."""
    identity = {"processor": platform.processor() or platform.machine(),
                "torch": torch.__version__,
                "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    return identity | cpuinfo(CPUINFO_FIELDS)


def cpuinfo(fields: tuple[str, ...]) -> dict[str, str]:
    """The first processor's `fields` in /proc/cpuinfo (none where it cannot be read)."""
    try:
        lines = CPUINFO.read_text().splitlines()
    except OSError:
        return {}
    found: dict[str, str] = {}
    for line in lines:
        field, _, value = line.partition(":")
        if field.strip() in fields:
            found.setdefault(field.strip(), value.strip())
    return found


def _digest(identity: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _entry(entry: object) -> tuple[int, Times]:
    """A kept entry's number of measurements and times; (0, []) where none is, or where what
    is there is not that (a file from another version, edited, cut short)."""
    try:
        measurements, times = entry["measurements"], entry["times"]
        if (isinstance(measurements, int) and measurements > 0 and times
                and all(isinstance(row, list) and row
                        and all(isinstance(t, float) for t in row) for row in times)):
            return measurements, times
    except (TypeError, KeyError):
        pass
    return 0, []


def _same_shape(kept: Times, times: Times) -> bool:
    return len(kept) == len(times) and all(len(a) == len(b) for a, b in zip(kept, times))
