"""A short run of `make soak` (bench/soak.py): mixed traffic of every protocol, drops and
malformed requests and bursts over the queue limit, with nothing failed, leaked or 5xx."""

from __future__ import annotations

import json
import subprocess
import sys

SOAK_S = 45


def test_a_short_soak_passes(tmp_path) -> None:
    out = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, "-m", "bench.soak", "--duration", str(SOAK_S),
                          "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert (figures["leaked_kv_blocks"], figures["leaked_slots"], figures["unexpected_5xx"],
            figures["failed"]) == (0, 0, 0, 0)
    requests = figures["requests"]
    assert requests["malformed"]["refused as malformed"] == requests["malformed"]["sent"] > 0
    assert requests["dropped"]["sent"] > 0
    assert sum(kind.get("refused for load", 0) for kind in requests.values()) > 0
    assert all(kind.get("succeeded", 0) > 0 for name, kind in requests.items()
               if name not in ("malformed", "dropped"))
    assert figures["server_rss_growth"] < 0.05
