"""The `switchboard` command: `server`, `gateway`, or `run` (both). Only this module reads argv,
files and the environment. It imports neither torch nor the engine's runtime until `server`
starts serving, so the gateway process never loads them."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from switchboard.engine.config import (DEFAULT_GUIDED_COMPILE_CPU_SECONDS,
                                       DEFAULT_GUIDED_COMPILE_MIB, DEVICES, DTYPES,
                                       GUIDED_CACHE_MIB_RANGE, GUIDED_CACHE_SHARE, MAX_SEQUENCES,
                                       DEFAULT_KV_TRANSFER_LEASE_S, QUANTIZATIONS,
                                       SLOTS_PER_REQUEST_SHARE, EngineConfig)
from switchboard.engine.reasoning import REASONING_PARSERS
from switchboard.engine.tool_parsers import TOOL_CALL_PARSERS
from switchboard.gateway.config import (DEFAULT_BUSINESS_PORT, DEFAULT_CLIENT_TIMEOUT_S, DEFAULT_HTTP_HOST,
                            DEFAULT_MANAGEMENT_PORT, MAX_BODY_BYTES,
                            DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEADER_BYTES,
                            DEFAULT_METRICS_PORT, DEFAULT_UPSTREAM,
                            GatewayConfig, Plane, PlaneConfig, TLSMode, UpstreamConfig)
from switchboard.gateway.roles import NO_ROLE, ROLES
from switchboard.server.config import (DEFAULT_GRPC_HOST, DEFAULT_GRPC_PORT, DEFAULT_MODEL_NAME, ConfigError,
                           ServerConfig, crl_file_from_settings, read_config_file,
                           tls_files_from_settings)
from switchboard.process import (READY_FD_FLAG, ChildProcess, GatewayProcess, ServerProcess,
                                 announce_ready)
from switchboard.tls import TLSConfigError, TLSFiles, dev_files
from switchboard.tls.pki import GATEWAY_IDENTITY

logger = logging.getLogger("switchboard")

DEFAULT_TLS_DIR = Path("tls/dev")
LOG_LEVELS = ("debug", "info", "warning", "error")
KEY_PASSWORD_ENV = "SWITCHBOARD_TLS_KEY_PASSWORD"
# `run`: after one child stops by itself, how long its partner has to follow (a /stopService
# stops both; the server takes a few seconds to close) before it is sent SIGTERM.
PARTNER_EXIT_GRACE_S = 15
ENGINE_SETTINGS = tuple(field.name for field in dataclasses.fields(EngineConfig))
SERVER_FLAGS = frozenset({"model", "model_name", "device", "dtype", "quantization", "grpc_host",
                          "grpc_port", "cache_dir", "tls_crl", "enforce_eager",
                          "enable_deterministic_inference",
                          "num_speculative_tokens", "allow_insecure_non_loopback",
                          "management_identities", "chat_template", "tool_call_parser",
                          "enable_auto_tool_choice", "reasoning_parser", "guided_cache_mib",
                          "guided_compile_mib", "guided_compile_cpu_seconds", "max_best_of",
                          "max_slots_per_request", "kv_transfer_lease_s", "kv_transfer_host",
                          "kv_transfer_cert", "kv_transfer_key", "kv_transfer_ca"})


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.command(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchboard", description=__doc__)
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = commands.add_parser("server", aliases=["serve"],
                                help="serve a model over KServe v2 gRPC (mutual TLS)")
    serve.set_defaults(command=_serve)
    _add_common_arguments(serve)
    _add_server_arguments(serve)

    gateway = commands.add_parser("gateway", help="serve the REST routes over HTTPS, transcoded "
                                                  "to the gRPC server (mutual TLS on both hops)")
    gateway.set_defaults(command=_gateway)
    _add_common_arguments(gateway)
    _add_gateway_arguments(gateway)

    run = commands.add_parser("run", help="start the server, then the gateway in front of it; "
                                          "Ctrl-C stops both")
    _add_common_arguments(run)
    server_options = _add_server_arguments(run)
    gateway_options = _add_gateway_arguments(run, with_upstream=False)
    run.set_defaults(command=_run, server_options=server_options,
                     gateway_options=gateway_options)
    return parser


def _add_common_arguments(parser: argparse.ArgumentParser) -> None:
    # Also after the command (make run ARGS="--log-level debug"); `run` passes it on.
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=argparse.SUPPRESS,
                        help="default: info")
    parser.add_argument("--config", type=Path,
                        help="JSON config file with MindIE's config.json keys")
    parser.add_argument("--tls-dir", type=Path,
                        help="folder with ca.pem, server.pem, server.key.pem, client.pem, "
                             "client.key.pem, gateway.pem, gateway.key.pem (default: "
                             f"{DEFAULT_TLS_DIR}; a config file's TLS keys replace its server "
                             "files, and the gateway's calls to the server use its gateway "
                             "files all the same)")
    parser.add_argument("--insecure", action="store_true",
                        help="no TLS at all: plaintext gRPC, plain HTTP on loopback (logs a warning)")
    parser.add_argument("--tls-crl", type=Path,
                        help="a PEM CRL of the CA: client certificates it lists are refused "
                             "(default: the config file's tlsCrlPath/tlsCrlFiles)")
    parser.add_argument("--tls-key-password-file", type=Path,
                        help=f"a file holding the password of encrypted private keys (else the "
                             f"{KEY_PASSWORD_ENV} environment variable; never a flag)")
    parser.add_argument(READY_FD_FLAG, type=int, metavar="FD",
                        help="once serving, write the addresses as one JSON line to this open "
                             "file descriptor (a pipe from the parent process) and close it")


class _Flags:
    """Adds a process's own flags to a parser and remembers them as {dest: option}, for `run`
    to pass on to that process."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._parser = parser
        self.options: dict[str, str] = {}

    def __call__(self, *flags: str, **options: object) -> None:
        action = self._parser.add_argument(*flags, **options)
        self.options[action.dest] = action.option_strings[0]


def _add_server_arguments(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The server's own flags, as {dest: option}."""
    add = _Flags(parser)
    add("--model", type=Path,
        help="a Hugging Face folder or a .gguf file (default: the packaged SmolLM2)")
    add("--model-name", help=f"name clients use (default: {DEFAULT_MODEL_NAME})")
    add("--device", choices=DEVICES, help="default: auto (cuda, then npu, then cpu)")
    add("--dtype", choices=DTYPES,
        help="default: auto (bfloat16 on accelerators, float32 on CPU); a dtype asked for "
             "keeps a .gguf model's weights unquantized in it unless --quantization says more")
    add("--quantization", choices=QUANTIZATIONS,
        help="weight-only quantized linears on CPU: int8, int4, gguf (a .gguf file's own "
             "precision per matrix), or none; default: auto (gguf for a .gguf model on CPU "
             "without --dtype, else none)")
    add("--enforce-eager", action="store_true", default=None,
        help="run every step eagerly: no CUDA graphs for decode steps")
    add("--enable-deterministic-inference", action="store_true", default=None,
        help="the same logits for a sequence whatever else runs beside it, so that a seed "
             "reproduces its sample (SGLang's flag; CPU, with the native kernels); slower")
    add("--speculate", type=int, dest="num_speculative_tokens", metavar="N",
        help="n-gram speculation: guess up to N next tokens of each decoding request from its "
             "own text, verified in the same step; default: 0 (off)")
    add("--chat-template", type=Path, metavar="FILE",
        help="a Jinja chat template replacing the model's (vLLM's flag)")
    add("--tool-call-parser", choices=list(TOOL_CALL_PARSERS),
        help="how the model writes tool calls, read into tool_calls (vLLM's flag)")
    add("--enable-auto-tool-choice", action="store_true", default=None,
        help='let requests leave calling a tool to the model (tool_choice "auto"); needs '
             "--tool-call-parser (vLLM's flag)")
    add("--reasoning-parser", choices=list(REASONING_PARSERS),
        help="split the model's thinking (<think>...</think>) into reasoning_content "
             "(vLLM's flag)")
    add("--max-best-of", type=int, metavar="N",
        help=f"the most sequences one request may ask for (n, best_of); default: "
             f"{MAX_SEQUENCES}, at most {MAX_SEQUENCES}")
    add("--max-slots-per-request", type=int, metavar="N",
        help="the most of one request's sequences that run at once, of maxBatchSize slots; "
             f"the others start as those end (default: 1/{SLOTS_PER_REQUEST_SHARE} of "
             "maxBatchSize)")
    add("--guided-compile-mib", type=int, metavar="MIB",
        help="memory one structured-output pattern may take to compile; past it the "
             f"pattern is refused (default: {DEFAULT_GUIDED_COMPILE_MIB})")
    add("--guided-compile-cpu-seconds", type=int, metavar="S",
        help="CPU time one structured-output pattern may take to compile; past it the "
             f"pattern is refused (default: {DEFAULT_GUIDED_COMPILE_CPU_SECONDS})")
    add("--guided-cache-mib", type=int, metavar="MIB",
        help="compiled structured-output patterns kept for reuse, in MiB (default: "
             f"1/{GUIDED_CACHE_SHARE} of the machine's memory, within "
             f"{'-'.join(map(str, GUIDED_CACHE_MIB_RANGE))})")
    add("--grpc-host", help=f"default: {DEFAULT_GRPC_HOST}")
    add("--grpc-port", type=int, help=f"default: {DEFAULT_GRPC_PORT}; 0 picks a free port")
    add("--allow-insecure-non-loopback", action="store_true", default=None,
        help="with --insecure, serve plaintext gRPC on a --grpc-host other than loopback "
             "(refused otherwise): anyone on the network can then use and stop the server")
    add("--management-identity", action="append", dest="management_identities", metavar="NAME",
        help="the common name of a client certificate that may call the management "
             "operations (StopService), repeatable; other certificates get PERMISSION_DENIED "
             f"(default: {GATEWAY_IDENTITY}, the gateway's own gateway.pem)")
    add("--cache-dir", type=Path,
        help="where converted GGUF models are kept (default: ~/.cache/switchboard)")
    add("--kv-transfer-host", metavar="HOST",
        help="prefill/decode: the host other servers reach this one's gRPC port at, given "
             "in a prefill's kv_transfer_params (default: --grpc-host, or this machine's "
             "name where that is every address)")
    add("--kv-transfer-cert", type=Path, metavar="PEM",
        help="prefill/decode: the client certificate this server reads other servers' KV "
             "caches with (default: the TLS folder's client.pem)")
    add("--kv-transfer-key", type=Path, metavar="PEM",
        help="its private key (default: the TLS folder's client.key.pem)")
    add("--kv-transfer-ca", type=Path, metavar="PEM",
        help="the CA other servers' certificates are checked by when reading their KV "
             "caches (default: the server's CA)")
    add("--kv-transfer-lease", type=float, dest="kv_transfer_lease_s", metavar="S",
        help="prefill/decode: how long a prefill done for another server keeps its KV "
             f"cache when that server neither reads nor releases it (default: "
             f"{DEFAULT_KV_TRANSFER_LEASE_S:g})")
    return add.options


def _add_gateway_arguments(parser: argparse.ArgumentParser, *, with_upstream: bool = True
                           ) -> dict[str, str]:
    """The gateway's own flags, as {dest: option}."""
    add = _Flags(parser)
    if with_upstream:
        add("--upstream", "--decode",
            help=f"the gRPC server, HOST:PORT (default: the config file's "
                 f"grpcIpAddress:grpcPort, else {DEFAULT_UPSTREAM}); with --prefill, the one "
                 "that decodes")
        add("--prefill", metavar="HOST:PORT",
            help="prefill/decode disaggregation coordinated by the gateway: the gRPC server "
                 "that prefills each prompt for --upstream to decode (mutual TLS with the "
                 "gateway's own certificate, as to --upstream)")
    add("--role", choices=ROLES,
        help="MindIE's prefill/decode role from the start, as if its controller had assigned "
             "it (POST /v1/role/{role} changes it; default: none)")
    add("--http-host", help=f"business plane address (default: {DEFAULT_HTTP_HOST})")
    add("--http-port", type=int,
        help=f"business plane port (default: {DEFAULT_BUSINESS_PORT}; 0 picks one)")
    add("--management-host",
        help="management and metrics planes' address (default: the business plane's)")
    add("--management-port", type=int, help=f"default: {DEFAULT_MANAGEMENT_PORT}; 0 picks one")
    add("--metrics-port", type=int,
        help=f"default: {DEFAULT_METRICS_PORT}; may equal the management port")
    for plane in Plane:
        add(f"--{plane.value}-tls", choices=[mode.value for mode in TLSMode],
            help=f"the {plane.value} plane's TLS: mutual (default), server (no client "
                 "certificate asked), none (plain HTTP, loopback only)")
    add("--max-body-bytes", type=int,
        help=f"larger request bodies get 413 (default and most: {MAX_BODY_BYTES})")
    add("--max-connections", type=int,
        help="MindIE's maxLinkNum N: N inference requests forwarded at once, the next wait "
             "their turn; one connection over 3N per plane gets 503 (default: the config "
             f"file's maxLinkNum, else {DEFAULT_MAX_CONNECTIONS})")
    add("--max-client-connections", type=int,
        help="connections one client address may hold open per plane; one more gets 503 "
             "(default: the --max-connections value, a third of a plane's)")
    add("--client-timeout", type=float,
        help="seconds for a request's headers, for its body, and for an idle connection; "
             f"slower clients are cut off (default: {DEFAULT_CLIENT_TIMEOUT_S:g})")
    add("--max-header-bytes", type=int,
        help=f"larger request headers end the connection (default: {DEFAULT_MAX_HEADER_BYTES})")
    return add.options


def _serve(args: argparse.Namespace) -> int:
    try:
        engine_config, server_config = _configs(args)
    except (ConfigError, TLSConfigError, ValueError) as error:
        logger.error("%s", error)
        return 2
    logger.info("effective configuration: %s", json.dumps(_describe(engine_config, server_config)))
    # These import torch and transformers: only when serving.
    from switchboard.engine.loader import ModelLoadError
    from switchboard.server.app import ListenError, serve

    try:
        asyncio.run(serve(engine_config, server_config,
                          functools.partial(announce_ready, args.ready_fd)))
    except (ModelLoadError, ListenError) as error:
        logger.error("%s", error)
        return 1
    return 0


def _configs(args: argparse.Namespace) -> tuple[EngineConfig, ServerConfig]:
    """Defaults, then the config file, then command-line flags."""
    settings = read_config_file(args.config) if args.config else {}
    flags = {name: value for name, value in vars(args).items()
             if value is not None and name in SERVER_FLAGS}
    settings.update(flags)
    settings.setdefault("cache_dir", default_cache_dir())
    engine_config = EngineConfig(**{k: v for k, v in settings.items() if k in ENGINE_SETTINGS})
    insecure = args.insecure or settings.get("https_enabled") is False
    tls = None if insecure else _server_tls(args, settings)
    server_config = ServerConfig(
        model_name=settings.get("model_name", DEFAULT_MODEL_NAME),
        grpc_host=settings.get("grpc_host", DEFAULT_GRPC_HOST),
        grpc_port=settings.get("grpc_port", DEFAULT_GRPC_PORT),
        tls=tls,
        allow_insecure_non_loopback=bool(settings.get("allow_insecure_non_loopback")),
        management_identities=tuple(settings.get("management_identities", (GATEWAY_IDENTITY,))),
        kv_transfer_tls=None if tls is None else _kv_transfer_tls(args, settings, tls),
        kv_transfer_host=settings.get("kv_transfer_host", ""),
    )
    return engine_config, server_config


def _kv_transfer_tls(args: argparse.Namespace, settings: dict[str, object],
                     server: TLSFiles) -> TLSFiles:
    """The server's identity towards other servers (read when first used: a server that
    never decodes another's prefill needs none)."""
    client = dev_files(args.tls_dir or DEFAULT_TLS_DIR, "client")
    return TLSFiles(ca_file=settings.get("kv_transfer_ca", server.ca_file),
                    cert_file=settings.get("kv_transfer_cert", client.cert_file),
                    key_file=settings.get("kv_transfer_key", client.key_file),
                    key_password=_key_password(args))


def _gateway(args: argparse.Namespace) -> int:
    try:
        config = gateway_config(args)
    except (ConfigError, TLSConfigError, ValueError) as error:
        logger.error("%s", error)
        return 2
    from switchboard.gateway.app import ListenError, serve as serve_gateway

    try:
        asyncio.run(serve_gateway(config, functools.partial(announce_ready, args.ready_fd)))
    except ListenError as error:
        logger.error("%s", error)
        return 1
    return 0


def gateway_config(args: argparse.Namespace) -> GatewayConfig:
    """Defaults, then the config file, then command-line flags."""
    settings = read_config_file(args.config) if args.config else {}
    settings.update({name: value for name, value in vars(args).items() if value is not None})
    insecure = args.insecure or settings.get("https_enabled") is False
    if insecure:
        logger.warning("--insecure: plain HTTP on every plane and plaintext gRPC upstream")
    server_files = None if insecure else _server_tls(args, settings)
    http_host = settings.get("http_host", DEFAULT_HTTP_HOST)
    management_host = settings.get("management_host", http_host)
    planes = []
    for plane, host, port in ((Plane.BUSINESS, http_host, DEFAULT_BUSINESS_PORT),
                              (Plane.MANAGEMENT, management_host, DEFAULT_MANAGEMENT_PORT),
                              (Plane.METRICS, management_host, DEFAULT_METRICS_PORT)):
        mode = TLSMode.NONE if insecure else TLSMode(settings.get(f"{plane.value}_tls", "mutual"))
        planes.append(PlaneConfig(plane=plane, host=host, port=settings.get(
            f"{'http' if plane is Plane.BUSINESS else plane.value}_port", port), tls_mode=mode,
            tls=None if mode is TLSMode.NONE else server_files))
    upstream = settings.get("upstream") or (
        f"{settings.get('grpc_host', DEFAULT_GRPC_HOST)}:{settings['grpc_port']}"
        if "grpc_port" in settings
        else DEFAULT_UPSTREAM)
    client_files = None if insecure else dataclasses.replace(
        dev_files(args.tls_dir or DEFAULT_TLS_DIR, "gateway"), key_password=_key_password(args))
    if client_files is not None:
        try:
            client_files.load()
        except TLSConfigError as error:
            raise ConfigError(
                "the gateway's client certificate for its calls to the server is the TLS "
                f"folder's gateway.pem and gateway.key.pem (--tls-dir, default {DEFAULT_TLS_DIR}; "
                f"a config file's TLS keys are the server's certificate): {error}") from None
    return GatewayConfig(planes=tuple(planes),
                         upstream=UpstreamConfig(target=upstream, tls=client_files),
                         max_body_bytes=settings.get("max_body_bytes", MAX_BODY_BYTES),
                         max_connections=settings.get("max_connections", DEFAULT_MAX_CONNECTIONS),
                         client_timeout_s=settings.get("client_timeout", DEFAULT_CLIENT_TIMEOUT_S),
                         max_header_bytes=settings.get("max_header_bytes",
                                                       DEFAULT_MAX_HEADER_BYTES),
                         max_client_connections=settings.get("max_client_connections"),
                         prefill=UpstreamConfig(target=settings["prefill"], tls=client_files)
                         if settings.get("prefill") else None,
                         role=settings.get("role", NO_ROLE))


def _server_tls(args: argparse.Namespace, settings: dict[str, object]) -> TLSFiles:
    """The server's certificate (gRPC, or the gateway's planes): the TLS folder's server files
    when --tls-dir is given, else the config file's TLS keys, else the dev folder's; with the
    CRL and the key password."""
    files = None if args.tls_dir is not None else tls_files_from_settings(settings)
    files = dataclasses.replace(files or dev_files(args.tls_dir or DEFAULT_TLS_DIR, "server"),
                                crl_file=crl_file_from_settings(settings),
                                key_password=_key_password(args))
    files.load()
    return files


def _key_password(args: argparse.Namespace) -> bytes | None:
    """From --tls-key-password-file (its first line), else the environment."""
    if args.tls_key_password_file is not None:
        try:
            lines = args.tls_key_password_file.read_bytes().splitlines()
        except OSError as error:
            raise ConfigError(f"key password file {args.tls_key_password_file} cannot be read: "
                              f"{error.strerror}") from None
        return lines[0] if lines else b""
    password = os.environ.get(KEY_PASSWORD_ENV)
    return None if password is None else password.encode()


def _run(args: argparse.Namespace) -> int:
    """The server and the gateway as child processes. SIGINT or SIGTERM is passed on to both:
    they finish the requests in flight and exit; a second signal stops them at once. SIGHUP is
    passed on too (both read their TLS files again). When the server exits by itself
    (StopService), the gateway, which cannot serve without it, is stopped as by SIGTERM at
    once; when the gateway does (/stopService, which stops both), the server is, unless it
    exits too within PARTNER_EXIT_GRACE_S. `run` exits 0 if both exit 0."""
    shared = [f"--log-level={args.log_level}",
              *(["--config", str(args.config)] if args.config else []),
              *(["--tls-dir", str(args.tls_dir)] if args.tls_dir else []),
              *(["--tls-crl", str(args.tls_crl)] if args.tls_crl else []),
              *(["--tls-key-password-file", str(args.tls_key_password_file)]
                if args.tls_key_password_file else []),
              *(["--insecure"] if args.insecure else [])]
    server_flags, gateway_flags = (_flags_given(args, options)
                                   for options in (args.server_options, args.gateway_options))
    # Both configurations are checked before the model loads, which may take minutes.
    try:
        _configs(_parser().parse_args(["server", *shared, *server_flags]))
        gateway_config(_parser().parse_args(["gateway", *shared, *gateway_flags]))
    except (ConfigError, TLSConfigError, ValueError) as error:
        logger.error("%s", error)
        return 2
    done = threading.Event()  # a signal came, or a child exited
    signalled = threading.Event()
    children: list[ChildProcess] = []

    def on_signal(signum: int, _frame: object) -> None:
        signalled.set()
        for child in children:
            child.terminate()
        done.set()

    def on_hangup(_signum: int, _frame: object) -> None:
        for child in children:
            child.reload_tls()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    signal.signal(signal.SIGHUP, on_hangup)
    try:
        server = ServerProcess(*shared, *server_flags, echo=True, free_port=False,
                               on_exit=done.set)
        children.append(server)
        server.wait_ready()
        gateway = GatewayProcess(*shared, *gateway_flags, f"--upstream={server.address}",
                                 echo=True, on_exit=done.set)
        children.append(gateway)
        announce_ready(args.ready_fd, {**gateway.wait_ready(), "grpc": server.address})
        done.wait()
        if signalled.is_set():
            statuses = [child.stop(timeout_s=None) for child in children]
            return 0 if statuses == [0] * len(children) else 1
        if server.process.poll() is not None:
            gateway.terminate()
        statuses = [child.wait_exit(PARTNER_EXIT_GRACE_S) for child in children]
        statuses = [child.stop() if status is None else status
                    for child, status in zip(children, statuses)]
        if statuses == [0] * len(children):
            return 0
        logger.error("a child process exited (statuses %s); stopping", statuses)
        return 1
    except RuntimeError as error:
        logger.error("%s", error)
        return 1
    finally:
        for child in reversed(children):
            child.stop()


def _flags_given(args: argparse.Namespace, options: dict[str, str]) -> list[str]:
    """The flags of `options` ({dest: option}) that `args` were given, to pass on."""
    flags = []
    for dest, option in options.items():
        value = getattr(args, dest)
        if isinstance(value, bool):
            flags.append(option)
        elif isinstance(value, list):
            flags.extend(f"{option}={item}" for item in value)
        elif value is not None:
            flags.append(f"{option}={value}")
    return flags


def default_cache_dir() -> Path:
    """Where converted models are kept: $XDG_CACHE_HOME/switchboard or ~/.cache/switchboard."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "switchboard"


def _describe(engine_config: EngineConfig, server_config: ServerConfig) -> dict[str, object]:
    """The effective configuration, for the log: paths as strings, no key material."""
    described = {**dataclasses.asdict(engine_config), **dataclasses.asdict(server_config)}
    for name in ("tls", "kv_transfer_tls"):
        if isinstance(described[name], dict):
            described[name]["key_password"] = \
                "(set)" if getattr(server_config, name).key_password else None
    return json.loads(json.dumps(described, default=str))


if __name__ == "__main__":
    sys.exit(main())
