"""`switchboard run` (what `make run` calls) starts the server and the gateway, and Ctrl-C
stops both cleanly."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

from gateway_clients import MODEL, curl_with


def test_run_serves_through_the_gateway_and_ctrl_c_stops_both(pki, client_files) -> None:
    run = subprocess.Popen(
        [sys.executable, "-m", "server", "run", "--tls-dir", str(pki.folder), "--http-port", "0",
         "--management-port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log = []
        for line in run.stdout:
            log.append(line)
            ready = re.search(r"gateway ready: business on (\S+),", line)
            if ready:
                break
        assert ready, "".join(log)
        reply = curl_with(client_files, f"{ready[1]}/v2/models/{MODEL}/generate",
                          body={"text_input": "The capital of France is",
                                "parameters": {"max_new_tokens": 3, "do_sample": False}})
        assert reply.status == 200 and "Paris" in reply.json()["text_output"], reply.body
        children = subprocess.run(["pgrep", "-P", str(run.pid)], capture_output=True, text=True)
        child_pids = children.stdout.split()
        assert len(child_pids) == 2, children.stdout
        run.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
        assert run.wait(60) == 0, run.stdout.read()
        still_alive = subprocess.run(["ps", "-o", "pid=", "-p", ",".join(child_pids)],
                                     capture_output=True, text=True)
        assert still_alive.stdout.strip() == "", "a child outlived `switchboard run`"
    finally:
        if run.poll() is None:
            run.kill()
