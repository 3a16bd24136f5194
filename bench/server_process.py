"""The real server as a subprocess, started as tests/conftest.py does: port 0, the address read
back from its "ready" line, SIGTERM to stop. Its log is drained (and its tail kept) so that a
full pipe never blocks it."""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil

READY_LINE = re.compile(r"ready: serving model '(?P<model>[^']+)' over gRPC on "
                        r"(?P<host>\S+):(?P<port>\d+)")
# The first start on a fresh machine converts the GGUF model once (~30 s on 2 cores).
START_TIMEOUT_S = 600
STOP_TIMEOUT_S = 30


class ServerProcess:
    def __init__(self, tls_dir: Path, config: Path | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "server", "serve", "--grpc-port", "0",
             "--tls-dir", str(tls_dir), *(["--config", str(config)] if config else [])],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.log: collections.deque[str] = collections.deque(maxlen=200)
        self.address = ""
        self.model_name = ""
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def wait_ready(self) -> None:
        if not self._ready.wait(START_TIMEOUT_S) or not self.address:
            self.stop()
            raise RuntimeError("the server did not become ready:\n" + "\n".join(self.log))

    def peak_rss_bytes(self) -> int:
        """VmHWM: the most resident memory the server process has had."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc/<pid>/status")

    def cpu_seconds(self) -> float:
        """User and system CPU time the server has used so far, all its threads together."""
        times = psutil.Process(self.process.pid).cpu_times()
        return times.user + times.system

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.log.append(line.rstrip())
            match = READY_LINE.search(line)
            if match and not self.address:
                self.address = f"{match['host']}:{match['port']}"
                self.model_name = match["model"]
                self._ready.set()
        self._ready.set()
