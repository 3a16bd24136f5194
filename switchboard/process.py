"""`switchboard server` and `switchboard gateway` as child processes: for `switchboard run`, the
tests and the benchmark.

Each listens where its flags say (port 0 in tests). Once it serves, it writes its addresses
as one JSON line to a readiness pipe (`--ready-fd`, the write end its parent passed it) and
closes it: its parent learns readiness from that, never from its log, and a child that exits
before it is ready closes the pipe empty. SIGTERM stops it. Its output is drained (the tail
kept, and echoed when asked) so that a full pipe never blocks it. Standard library only: tests
that drive it with tritonclient must not load our protobuf modules.
"""

from __future__ import annotations

import collections
import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

READY_FD_FLAG = "--ready-fd"
# The first start on a fresh machine converts the GGUF model once, which takes a while on a
# small CPU (docs/engine-measurements.md#start-up-and-loading).
START_TIMEOUT_S = 600
STOP_TIMEOUT_S = 30
LOG_LINES_KEPT = 400


def announce_ready(ready_fd: int | None, addresses: Mapping[str, str]) -> None:
    """In a child: tell the parent that it serves, at `addresses`, on the readiness pipe
    (None: no parent asked)."""
    if ready_fd is not None:
        with os.fdopen(ready_fd, "w") as pipe:
            pipe.write(json.dumps(dict(addresses)) + "\n")


class ChildProcess:
    def __init__(self, args: list[str], *, echo: bool = False,
                 on_exit: Callable[[], None] | None = None) -> None:
        """args: the `switchboard` command line after the program name; on_exit is called (from
        another thread) when the process's output ends, i.e. when it exits."""
        ready_reader, ready_writer = os.pipe()
        # A process group of its own: a terminal's Ctrl-C reaches the parent only, which
        # decides what the child gets (a second signal stops it without draining).
        self.process = subprocess.Popen(
            [sys.executable, "-m", "switchboard", *args, f"{READY_FD_FLAG}={ready_writer}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            process_group=0, pass_fds=(ready_writer,),
        )
        os.close(ready_writer)  # the child's copy alone: its exit ends the pipe
        self._ready_pipe = os.fdopen(ready_reader)
        self._addresses: dict[str, str] | None = None
        self._terminated = False
        self.log: collections.deque[str] = collections.deque(maxlen=LOG_LINES_KEPT)
        self._echo = echo
        self._on_exit = on_exit
        threading.Thread(target=self._drain, daemon=True).start()

    def wait_ready(self) -> dict[str, str]:
        """Block until the child announces its addresses; stop it and raise with its log if it
        exits first or takes longer than START_TIMEOUT_S."""
        if self._addresses is None:
            readable, _, _ = select.select([self._ready_pipe], [], [], START_TIMEOUT_S)
            line = self._ready_pipe.readline() if readable else ""
            self._ready_pipe.close()
            if not line:
                self.stop()
                raise RuntimeError(f"{self.process.args[3]} did not become ready:\n"
                                   f"{self.log_text()}")
            self._addresses = json.loads(line)
        return self._addresses

    def terminate(self) -> None:
        """SIGTERM: the first lets the requests in flight finish, a second stops at once."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self._terminated = True

    def reload_tls(self) -> None:
        """SIGHUP: the process reads its TLS files again (certificate rotation)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGHUP)

    def stop(self, timeout_s: float | None = STOP_TIMEOUT_S) -> int:
        """SIGTERM unless sent already, then SIGKILL if it outlives `timeout_s` (None: wait as
        long as it takes); returns the exit status."""
        if not self._terminated:
            self.terminate()
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit status once it exits by itself within `timeout_s`, else None."""
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def log_text(self) -> str:
        return "\n".join(self.log)

    def peak_rss_bytes(self) -> int:
        """VmHWM: the most resident memory the process has had."""
        return self._memory("VmHWM")

    def rss_bytes(self) -> int:
        """VmRSS: the resident memory now."""
        return self._memory("VmRSS")

    def _memory(self, field: str) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {field} in /proc/<pid>/status")

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if self._echo:
                sys.stdout.write(line)
                sys.stdout.flush()
            self.log.append(line.rstrip())
        if self._on_exit is not None:
            self._on_exit()


class ServerProcess(ChildProcess):
    def __init__(self, *args: str, echo: bool = False, free_port: bool = True,
                 on_exit: Callable[[], None] | None = None) -> None:
        """args: `switchboard server` flags; free_port: on a port the system picks (tests,
        the benchmark), else on the configured grpcPort (8001 by default), as `run` serves."""
        super().__init__(["server", *(["--grpc-port", "0"] if free_port else []), *args],
                         echo=echo, on_exit=on_exit)

    @property
    def address(self) -> str:
        return self.wait_ready()["address"]

    @property
    def model_name(self) -> str:
        return self.wait_ready()["model"]


class GatewayProcess(ChildProcess):
    def __init__(self, *args: str, echo: bool = False,
                 on_exit: Callable[[], None] | None = None) -> None:
        """args: `switchboard gateway` flags (ports, --upstream, TLS)."""
        super().__init__(["gateway", *args], echo=echo, on_exit=on_exit)

    def url(self, plane: str) -> str:
        """The base URL of a plane: business, management or metrics."""
        return self.wait_ready()[plane]
