"""`switchboard serve` as a child process, for the tests and the benchmark.

It listens on port 0; its address is read back from the "ready" line it logs; SIGTERM stops
it. Its output is drained (the tail kept) so that a full pipe never blocks it. Standard
library only: tests that drive it with tritonclient must not load our protobuf modules.
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

READY_LINE = re.compile(r"ready: serving model '(?P<model>[^']+)' over gRPC on "
                        r"(?P<host>\S+):(?P<port>\d+)")
# The first start on a fresh machine converts the GGUF model once (~30 s on 2 cores).
START_TIMEOUT_S = 600
STOP_TIMEOUT_S = 30
LOG_LINES_KEPT = 400


class ServerProcess:
    def __init__(self, *args: str) -> None:
        """args: `switchboard serve` flags beyond `--grpc-port 0`."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "server", "serve", "--grpc-port", "0", *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.log: collections.deque[str] = collections.deque(maxlen=LOG_LINES_KEPT)
        self.address = ""
        self.model_name = ""
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def wait_ready(self) -> None:
        """Block until the ready line; stop the server and raise with its log if it never comes."""
        if not self._ready.wait(START_TIMEOUT_S) or not self.address:
            self.stop()
            raise RuntimeError(f"the server did not become ready:\n{self.log_text()}")

    def stop(self) -> int:
        """SIGTERM (a graceful stop), then SIGKILL if it lingers; returns the exit status."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def log_text(self) -> str:
        return "\n".join(self.log)

    def peak_rss_bytes(self) -> int:
        """VmHWM: the most resident memory the server process has had."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc/<pid>/status")

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
