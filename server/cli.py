"""The `switchboard` command. Only this module reads argv, files and the environment."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from engine.config import DEVICES, DTYPES, EngineConfig
from server.config import (DEFAULT_GRPC_HOST, DEFAULT_GRPC_PORT, DEFAULT_MODEL_NAME, ConfigError,
                           ServerConfig, read_config_file, tls_files_from_settings)
from tls import TLSConfigError, dev_files

logger = logging.getLogger("switchboard")

DEFAULT_TLS_DIR = Path("tls/dev")
ENGINE_SETTINGS = tuple(field.name for field in dataclasses.fields(EngineConfig))


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.command(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchboard", description=__doc__)
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error"))
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="serve a model over KServe v2 gRPC (mutual TLS)")
    serve.set_defaults(command=_serve)
    serve.add_argument("--config", type=Path, help="JSON config file with MindIE's config.json keys")
    serve.add_argument("--model", type=Path,
                       help="a Hugging Face folder or a .gguf file (default: the packaged SmolLM2)")
    serve.add_argument("--model-name", help=f"name clients use (default: {DEFAULT_MODEL_NAME})")
    serve.add_argument("--device", choices=DEVICES, help="default: auto (cuda, then npu, then cpu)")
    serve.add_argument("--dtype", choices=DTYPES,
                       help="default: auto (bfloat16 on accelerators, float32 on CPU)")
    serve.add_argument("--grpc-host", help=f"default: {DEFAULT_GRPC_HOST}")
    serve.add_argument("--grpc-port", type=int, help=f"default: {DEFAULT_GRPC_PORT}; 0 picks a free port")
    serve.add_argument("--tls-dir", type=Path,
                       help="folder with ca.pem, server.pem, server.key.pem "
                            f"(default: {DEFAULT_TLS_DIR}, unless the config file names TLS files)")
    serve.add_argument("--insecure", action="store_true",
                       help="serve plain-text gRPC with no TLS at all (logs a warning)")
    serve.add_argument("--cache-dir", type=Path,
                       help="where converted GGUF models are kept (default: ~/.cache/switchboard)")

    return parser


def _serve(args: argparse.Namespace) -> int:
    try:
        engine_config, server_config = _configs(args)
    except (ConfigError, TLSConfigError, ValueError) as error:
        logger.error("%s", error)
        return 2
    logger.info("effective configuration: %s", json.dumps(_describe(engine_config, server_config)))
    from server.app import serve  # imports torch and transformers: only when serving

    asyncio.run(serve(engine_config, server_config))
    return 0


def _configs(args: argparse.Namespace) -> tuple[EngineConfig, ServerConfig]:
    """Defaults, then the config file, then command-line flags."""
    settings = read_config_file(args.config) if args.config else {}
    flags = {name: value for name, value in vars(args).items()
             if value is not None and name not in ("command", "config", "insecure", "tls_dir",
                                                   "log_level")}
    settings.update(flags)
    settings.setdefault("cache_dir", default_cache_dir())
    engine_config = EngineConfig(**{k: v for k, v in settings.items() if k in ENGINE_SETTINGS})
    insecure = args.insecure or settings.get("https_enabled") is False
    if insecure:
        tls = None
    elif args.tls_dir is not None or tls_files_from_settings(settings) is None:
        tls = dev_files(args.tls_dir or DEFAULT_TLS_DIR, "server")
    else:
        tls = tls_files_from_settings(settings)
    if tls is not None:
        tls.load()
    server_config = ServerConfig(
        model_name=settings.get("model_name", DEFAULT_MODEL_NAME),
        grpc_host=settings.get("grpc_host", DEFAULT_GRPC_HOST),
        grpc_port=settings.get("grpc_port", DEFAULT_GRPC_PORT),
        tls=tls,
    )
    return engine_config, server_config


def default_cache_dir() -> Path:
    """Where converted models are kept: $XDG_CACHE_HOME/switchboard or ~/.cache/switchboard."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "switchboard"


def _describe(engine_config: EngineConfig, server_config: ServerConfig) -> dict[str, object]:
    """The effective configuration, for the log: paths as strings, no key material."""
    described = {**dataclasses.asdict(engine_config), **dataclasses.asdict(server_config)}
    return json.loads(json.dumps(described, default=str))


if __name__ == "__main__":
    sys.exit(main())
