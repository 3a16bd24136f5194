"""`switchboard run` (what `make run` calls) starts the server and the gateway; Ctrl-C,
/stopService on the management plane, or StopService to the server alone stops both cleanly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from gateway_clients import MODEL, curl_with, grpcurl

from switchboard.process import READY_FD_FLAG


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def switchboard_run(pki, tmp_path: Path, *flags: str
                    ) -> Iterator[tuple[subprocess.Popen, dict[str, str], list[str]]]:
    """`switchboard run [flags]` in a session of its own (as a terminal's foreground job), the
    addresses it announces once both children serve (the gateway's planes, and the server's
    `grpc`), and its two children's pids. The config file names a free gRPC port
    (`configured_grpc_port`)."""
    grpc_port = free_port()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"grpcPort": grpc_port}))
    ready_reader, ready_writer = os.pipe()
    run = subprocess.Popen(
        [sys.executable, "-m", "switchboard", "run", "--tls-dir", str(pki.folder), "--http-port", "0",
         "--management-port", "0", "--metrics-port", "0", "--config", str(config),
         f"{READY_FD_FLAG}={ready_writer}", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        pass_fds=(ready_writer,))
    os.close(ready_writer)
    try:
        with os.fdopen(ready_reader) as announced:
            line = announced.readline()
        assert line, run.communicate(timeout=60)[0]
        ready = {**json.loads(line), "configured_grpc_port": str(grpc_port)}
        children = subprocess.run(["pgrep", "-P", str(run.pid)], capture_output=True, text=True)
        child_pids = children.stdout.split()
        assert len(child_pids) == 2, children.stdout
        yield run, ready, child_pids
    finally:
        if run.poll() is None:
            run.kill()


def assert_all_exited(run: subprocess.Popen, child_pids: list[str]) -> None:
    assert run.wait(60) == 0, run.stdout.read()
    still_alive = subprocess.run(["ps", "-o", "pid=", "-p", ",".join(child_pids)],
                                 capture_output=True, text=True)
    assert still_alive.stdout.strip() == "", "a child outlived `switchboard run`"


def test_run_serves_through_the_gateway_and_ctrl_c_stops_both(pki, client_files,
                                                              tmp_path) -> None:
    with switchboard_run(pki, tmp_path) as (run, ready, child_pids):
        reply = curl_with(client_files, f"{ready['business']}/v2/models/{MODEL}/generate",
                          body={"text_input": "The capital of France is",
                                "parameters": {"max_new_tokens": 3, "do_sample": False}})
        assert reply.status == 200 and "Paris" in reply.json()["text_output"], reply.body
        # The server listens where the configuration says, not on a port of its choosing.
        assert ready["grpc"].rsplit(":", 1)[1] == ready["configured_grpc_port"]
        run.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
        assert_all_exited(run, child_pids)


def test_run_passes_the_servers_flags_on(pki, client_files, tmp_path) -> None:
    """`make run ARGS="--model-name …"`: the server's flags work on `run`, over the config
    file's settings."""
    grpc_port = free_port()
    with switchboard_run(pki, tmp_path, "--model-name", "renamed", "--grpc-port", str(grpc_port),
                         "--enforce-eager") as (run, ready, child_pids):
        assert ready["grpc"].rsplit(":", 1)[1] == str(grpc_port) != ready["configured_grpc_port"]
        reply = curl_with(client_files, f"{ready['business']}/v2/models/renamed/generate",
                          body={"text_input": "The capital of France is",
                                "parameters": {"max_new_tokens": 3, "do_sample": False}})
        assert reply.status == 200 and "Paris" in reply.json()["text_output"], reply.body
        run.send_signal(signal.SIGINT)
        assert_all_exited(run, child_pids)


def test_a_sighup_to_run_reloads_both_childrens_tls_files_and_run_serves_on(pki, client_files,
                                                                           tmp_path) -> None:
    """Certificate rotation as docs/operations.md says it: SIGHUP to the pid `make run` shows. It
    used to end `run` alone (the default action), orphaning the two children."""
    with switchboard_run(pki, tmp_path) as (run, ready, child_pids):
        run.send_signal(signal.SIGHUP)
        reloaded = []
        for line in run.stdout:
            if "TLS files reloaded" in line:
                reloaded.append(line)
                if len(reloaded) == 2:
                    break
        assert {"server" if "switchboard.server.credentials" in line else "gateway" for line in reloaded} \
            == {"server", "gateway"}, reloaded
        reply = curl_with(client_files, f"{ready['business']}/v2/models/{MODEL}/generate",
                          body={"text_input": "The capital of France is",
                                "parameters": {"max_new_tokens": 1, "do_sample": False}})
        assert reply.status == 200 and run.poll() is None, reply.body
        run.send_signal(signal.SIGINT)
        assert_all_exited(run, child_pids)


def test_stop_service_ends_run_with_status_0(pki, client_files, tmp_path) -> None:
    with switchboard_run(pki, tmp_path) as (run, ready, child_pids):
        reply = curl_with(client_files, f"{ready['management']}/stopService")
        assert reply.status == 200, reply.body
        assert_all_exited(run, child_pids)


def test_stop_service_to_the_server_alone_ends_run_with_status_0(pki, gateway_identity_files,
                                                                tmp_path) -> None:
    with switchboard_run(pki, tmp_path) as (run, ready, child_pids):
        stopped = grpcurl(ready["grpc"], gateway_identity_files,
                          "switchboard.v1.Management/StopService")
        assert stopped.returncode == 0, stopped.stderr
        assert_all_exited(run, child_pids)


@pytest.mark.parametrize("case", ["missing model", "not a model folder", "gRPC port taken",
                                  "business port taken"])
def test_a_process_that_cannot_start_says_why_in_one_line(pki, tmp_path, case) -> None:
    """An operator's usual mistakes end with one ERROR line and status 1, not a traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        command, says = {
            "missing model": (["server", "--grpc-port", "0", "--model", str(tmp_path / "none")],
                              f"model path {tmp_path / 'none'} does not exist"),
            "not a model folder": (["server", "--grpc-port", "0", "--model", str(tmp_path)],
                                   f"{tmp_path} is not a Hugging Face model folder"),
            "gRPC port taken": (["server", "--grpc-port", port],
                                f"gRPC cannot listen on 127.0.0.1:{port}"),
            "business port taken": (["gateway", "--http-port", port, "--management-port", "0",
                                     "--metrics-port", "0"],
                                    f"the business plane cannot listen on 127.0.0.1:{port}"),
        }[case]
        ran = subprocess.run([sys.executable, "-m", "switchboard", *command, "--tls-dir",
                              str(pki.folder)], capture_output=True, text=True, timeout=300)
    output = ran.stdout + ran.stderr
    assert ran.returncode == 1, output
    [error] = [line for line in output.splitlines() if " ERROR " in line]
    assert says in error, output
    assert "Traceback" not in output and "never awaited" not in output, output


def test_run_refuses_a_bad_gateway_setting_before_loading_the_model(pki, tmp_path) -> None:
    """The gateway's settings are checked before the server loads the model (minutes for a
    big one), with one ERROR line and status 2, as a bad server setting is."""
    ran = subprocess.run([sys.executable, "-m", "switchboard", "run", "--tls-dir", str(pki.folder),
                          "--http-port", "70000"], capture_output=True, text=True, timeout=120)
    output = ran.stdout + ran.stderr
    assert ran.returncode == 2, output
    [error] = [line for line in output.splitlines() if " ERROR " in line]
    assert "port must be in [0, 65535]; got 70000" in error, output
    assert "loading" not in output and "Traceback" not in output, output
