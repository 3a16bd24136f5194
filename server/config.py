"""Server configuration, and reading MindIE-style config.json files.

A config file is JSON whose keys follow MindIE's config.json where a concept matches
(maxSeqLen, httpsEnabled, tlsCaFile, ...). MindIE nests them (ServerConfig, BackendConfig,
ModelDeployConfig, ScheduleConfig, a ModelConfig list); here any nesting is accepted and the
known keys are read wherever they appear, so a flat file works too.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from switchboard.tls import TLSFiles
from switchboard.tls.pki import GATEWAY_IDENTITY
from switchboard.tls.plaintext import check_plaintext_host

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "smollm2"
DEFAULT_GRPC_HOST = "127.0.0.1"
DEFAULT_GRPC_PORT = 8001
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", ""})

# MindIE config.json key → our setting name (EngineConfig / ServerConfig field or CLI dest).
CONFIG_KEYS = {
    "modelName": "model_name",
    "modelWeightPath": "model",
    "maxSeqLen": "max_seq_len",
    "maxInputTokenLen": "max_input_token_len",
    "maxIterTimes": "max_iter_times",
    "maxBatchSize": "max_batch_size",
    "maxPrefillTokens": "max_prefill_tokens",
    "maxQueueLen": "max_queue_len",
    "maxBatchedTokens": "max_batched_tokens",
    "cacheBlockSize": "block_size",
    "kvCacheBlocks": "num_kv_blocks",
    "kvCacheMiB": "kv_cache_mib",
    "enablePrefixCaching": "enable_prefix_caching",
    "engineThreads": "num_threads",
    "httpsEnabled": "https_enabled",
    "tlsCaPath": "tls_ca_path",
    "tlsCaFile": "tls_ca_file",
    "tlsCert": "tls_cert",
    "tlsPk": "tls_pk",
    "tlsCrlPath": "tls_crl_path",
    "tlsCrlFiles": "tls_crl_files",
    "grpcIpAddress": "grpc_host",
    "grpcPort": "grpc_port",
    "ipAddress": "http_host",
    "port": "http_port",
    "managementIpAddress": "management_host",
    "managementPort": "management_port",
    "metricsPort": "metrics_port",
    "maxLinkNum": "max_connections",
    "device": "device",
    "dtype": "dtype",
    "quantization": "quantization",
    "enforceEager": "enforce_eager",
    "enableDeterministicInference": "enable_deterministic_inference",
    "numSpeculativeTokens": "num_speculative_tokens",
    "speculativeMaxBatch": "speculative_max_batch",
    "maxBestOf": "max_best_of",
    "maxSlotsPerRequest": "max_slots_per_request",
    "guidedCompileMiB": "guided_compile_mib",
    "guidedCompileCpuSeconds": "guided_compile_cpu_seconds",
    "guidedCacheMiB": "guided_cache_mib",
    "cacheDir": "cache_dir",
    "allowAllZeroIpListening": "allow_all_zero_ip_listening",
}
PATH_SETTINGS = frozenset({"model", "tls_ca_path", "tls_cert", "tls_pk", "tls_crl_path",
                           "cache_dir"})
# The settings read as booleans and as strings, checked as the file is read so that the error
# names the file's key: a string "false" would otherwise read as true. Numbers are checked,
# with their ranges, where they are used.
BOOLEAN_SETTINGS = frozenset({"enable_prefix_caching", "https_enabled", "enforce_eager",
                              "enable_deterministic_inference", "allow_all_zero_ip_listening"})
HOST_SETTINGS = frozenset({"grpc_host", "http_host", "management_host"})
STRING_SETTINGS = PATH_SETTINGS | HOST_SETTINGS | {"model_name", "device", "dtype",
                                                   "quantization"}
# Addresses that listen on every interface, which a file may name only with
# allowAllZeroIpListening true, as MindIE's config.json (command-line flags are not held to it).
ALL_ZERO_ADDRESSES = frozenset({"0.0.0.0", "::"})


class ConfigError(ValueError):
    """The config file cannot be used; the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    model_name: str = DEFAULT_MODEL_NAME
    grpc_host: str = DEFAULT_GRPC_HOST
    grpc_port: int = DEFAULT_GRPC_PORT
    tls: TLSFiles | None = None
    # Plaintext gRPC (no `tls`) on an address other than loopback, which is refused otherwise.
    allow_insecure_non_loopback: bool = False
    # The common names of the client certificates that may call the management operations
    # (StopService): the gateway's own, by default.
    management_identities: tuple[str, ...] = (GATEWAY_IDENTITY,)
    # Prefill/decode disaggregation: this server's identity towards the servers whose KV
    # caches it reads, and the CA it trusts them by (None: plaintext, as this server is); and
    # the host they reach this server at (empty: grpc_host, or this machine's name when
    # grpc_host listens on every address).
    kv_transfer_tls: TLSFiles | None = None
    kv_transfer_host: str = ""

    def __post_init__(self) -> None:
        if self.tls is None and not self.allow_insecure_non_loopback:
            check_plaintext_host(self.grpc_host, "plaintext gRPC (--insecure)",
                                 "--allow-insecure-non-loopback")
        if not self.model_name:
            raise ValueError("model_name must not be empty")
        if not all(self.management_identities):
            raise ValueError("a management identity must not be empty")
        if isinstance(self.grpc_port, bool) or not isinstance(self.grpc_port, int) \
                or not 0 <= self.grpc_port <= 65535:
            raise ValueError(f"grpc_port must be in [0, 65535]; got {self.grpc_port!r}")

    @property
    def is_insecure(self) -> bool:
        return self.tls is None

    @property
    def advertised_host(self) -> str:
        if self.kv_transfer_host:
            return self.kv_transfer_host
        return socket.getfqdn() if self.grpc_host in WILDCARD_HOSTS else self.grpc_host


def read_config_file(path: Path) -> dict[str, object]:
    """Settings found in a MindIE-style JSON file, keyed by our setting names.

    Relative paths are resolved against the file's folder, as MindIE resolves them against
    its install folder.
    """
    try:
        document = json.loads(path.read_text())
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"config file {path} is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"config file {path} must hold a JSON object")
    settings: dict[str, object] = {}
    all_zero_keys = []
    for key, value in _leaves(document):
        name = CONFIG_KEYS.get(key)
        if name is None:
            logger.debug("config key %s is not used by switchboard", key)
            continue
        if name in settings and settings[name] != value:
            raise ConfigError(f"config file {path} sets {key} twice, to different values")
        _check_type(path, key, name, value)
        settings[name] = value
        if name in HOST_SETTINGS and value in ALL_ZERO_ADDRESSES:
            all_zero_keys.append(key)
    all_zero_allowed = settings.pop("allow_all_zero_ip_listening", False)
    if all_zero_keys and not all_zero_allowed:
        raise ConfigError(f"config file {path}: {', '.join(all_zero_keys)} listens on every "
                          f"interface, which needs allowAllZeroIpListening set to true")
    for name in PATH_SETTINGS & settings.keys():
        if isinstance(settings[name], str):
            settings[name] = path.parent / settings[name]
    if "tls_ca_file" in settings:
        settings.setdefault("tls_ca_path", path.parent)
    if "tls_crl_files" in settings:
        settings.setdefault("tls_crl_path", path.parent)
    return settings


def _check_type(path: Path, key: str, name: str, value: object) -> None:
    if name in BOOLEAN_SETTINGS and not isinstance(value, bool):
        raise ConfigError(f"config file {path}: {key} must be true or false; got "
                          f"{json.dumps(value)}")
    if name in STRING_SETTINGS and not isinstance(value, str):
        raise ConfigError(f"config file {path}: {key} must be a string; got {json.dumps(value)}")


def tls_files_from_settings(settings: Mapping[str, object]) -> TLSFiles | None:
    """MindIE's TLS keys: tlsCaPath + tlsCaFile (a list; the first file is used), tlsCert, tlsPk."""
    if not any(key in settings for key in ("tls_ca_file", "tls_cert", "tls_pk")):
        return None
    missing = [key for key in ("tls_ca_file", "tls_cert", "tls_pk") if key not in settings]
    if missing:
        raise ConfigError("TLS settings need tlsCaFile, tlsCert and tlsPk together; missing: "
                          + ", ".join(missing))
    ca_file = settings["tls_ca_file"]
    if isinstance(ca_file, list):
        if not ca_file:
            raise ConfigError("tlsCaFile must name at least one file")
        ca_file = ca_file[0]
    ca_path = Path(settings.get("tls_ca_path", "."))
    return TLSFiles(ca_file=ca_path / str(ca_file), cert_file=Path(settings["tls_cert"]),
                    key_file=Path(settings["tls_pk"]))


def crl_file_from_settings(settings: Mapping[str, object]) -> Path | None:
    """`--tls-crl`, else MindIE's tlsCrlPath + tlsCrlFiles (a list of one file, or none: a
    CRL is optional). Unlike a second CA file, which could only refuse more clients, a
    second CRL would be refused rather than ignored: ignoring it would admit the
    certificates it revokes."""
    if settings.get("tls_crl"):
        return Path(str(settings["tls_crl"]))
    files = settings.get("tls_crl_files")
    if isinstance(files, list):
        if len(files) > 1:
            raise ConfigError(f"tlsCrlFiles: one CRL file (the CA's) is supported; got "
                              f"{len(files)}: {', '.join(map(str, files))}")
        files = files[0] if files else None
    if not files:
        return None
    return Path(str(settings.get("tls_crl_path", "."))) / str(files)


def _leaves(node: object) -> Iterator[tuple[str, object]]:
    """(key, value) for every non-object value; lists of objects (ModelConfig) are descended."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, dict) or (isinstance(value, list) and value
                                           and all(isinstance(item, dict) for item in value)):
                yield from _leaves(value)
            else:
                yield key, value
    elif isinstance(node, list):
        for item in node:
            yield from _leaves(item)
