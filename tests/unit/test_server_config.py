"""MindIE-style config files (server.config), the CLI's layering of defaults, file and flags
(server.cli), and the engine error -> gRPC status table (server.errors)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import grpc
import pytest

from switchboard.engine import errors as engine_errors
from switchboard.engine.config import EngineConfig, EngineLimits
from switchboard.engine.errors import (EngineDead, EngineError, GenerationFailed, InvalidRequest, NotFound,
                           Overloaded, PromptTooLong, RequestTimedOut)
from switchboard.engine.index_compiler import CompileLimits
from switchboard.gateway.config import GatewayConfig, Plane, TLSMode
from switchboard.cli import (KEY_PASSWORD_ENV, _configs, _describe, _flags_given, _parser,
                             gateway_config)
from switchboard.server.config import (ConfigError, ServerConfig, crl_file_from_settings, read_config_file,
                           tls_files_from_settings)
from switchboard.server.errors import status_for
from switchboard.tls.pki import GATEWAY_IDENTITY
from switchboard.tls import (CertificateAuthority, DevPKIPaths, TLSConfigError, TLSFiles, create_crl,
                 write_dev_pki)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPKIPaths:
    return write_dev_pki(tmp_path_factory.mktemp("cli") / "pki")


def mindie_config(**server_overrides: object) -> dict[str, object]:
    """The layout of MindIE's config.json, with the keys switchboard reads."""
    server = {"ipAddress": "127.0.0.1", "port": 1025, "httpsEnabled": True,
              "tlsCaPath": "security/ca/", "tlsCaFile": ["ca.pem"],
              "tlsCert": "security/certs/server.pem", "tlsPk": "security/keys/server.key.pem",
              **server_overrides}
    return {
        "Version": "1.0.0",
        "ServerConfig": {key: value for key, value in server.items() if value is not None},
        "BackendConfig": {
            "ModelDeployConfig": {
                "maxSeqLen": 1024,
                "maxInputTokenLen": 512,
                "ModelConfig": [{"modelName": "y", "modelWeightPath": "weights/model.gguf"}],
            },
            "ScheduleConfig": {"maxBatchSize": 16, "maxIterTimes": 256, "maxPrefillTokens": 4096},
        },
    }


def write_config(folder: Path, document: object) -> Path:
    path = folder / "config.json"
    path.write_text(json.dumps(document))
    return path


def pki_config(pki: DevPKIPaths, **server_overrides: object) -> dict[str, object]:
    return mindie_config(tlsCaPath=str(pki.folder), tlsCert=str(pki.server_cert),
                         tlsPk=str(pki.server_key), **server_overrides)


def configs(*args: str) -> tuple[EngineConfig, ServerConfig]:
    return _configs(_parser().parse_args(["server", *args]))


def test_mindie_config_keys_are_read_under_our_names(tmp_path: Path) -> None:
    settings = read_config_file(write_config(tmp_path, mindie_config()))
    assert settings == {
        "http_host": "127.0.0.1",
        "http_port": 1025,
        "https_enabled": True,
        "tls_ca_path": tmp_path / "security" / "ca",
        "tls_ca_file": ["ca.pem"],
        "tls_cert": tmp_path / "security" / "certs" / "server.pem",
        "tls_pk": tmp_path / "security" / "keys" / "server.key.pem",
        "max_seq_len": 1024,
        "max_input_token_len": 512,
        "model_name": "y",
        "model": tmp_path / "weights" / "model.gguf",
        "max_batch_size": 16,
        "max_iter_times": 256,
        "max_prefill_tokens": 4096,
    }


def test_absolute_paths_are_kept(tmp_path: Path) -> None:
    settings = read_config_file(write_config(tmp_path, {"tlsCert": "/etc/pki/server.pem"}))
    assert settings == {"tls_cert": Path("/etc/pki/server.pem")}


def test_a_flat_config_works_too(tmp_path: Path) -> None:
    settings = read_config_file(write_config(tmp_path, {"maxSeqLen": 100, "grpcPort": 9001}))
    assert settings == {"max_seq_len": 100, "grpc_port": 9001}


def test_a_key_set_twice_to_different_values_is_an_error(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"A": {"maxSeqLen": 100}, "B": {"maxSeqLen": 200}})
    with pytest.raises(ConfigError, match=re.escape(f"{path} sets maxSeqLen twice")):
        read_config_file(path)


def test_a_key_set_twice_to_the_same_value_is_accepted(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"A": {"maxSeqLen": 100}, "B": {"maxSeqLen": 100}})
    assert read_config_file(path) == {"max_seq_len": 100}


def test_a_path_set_twice_to_the_same_value_is_accepted(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"A": {"tlsCert": "server.pem"}, "B": {"tlsCert": "server.pem"}})
    assert read_config_file(path) == {"tls_cert": tmp_path / "server.pem"}


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must hold a JSON object"),
    ('"text"', "must hold a JSON object"),
])
def test_unusable_config_file_is_a_config_error_naming_it(tmp_path: Path, content: str,
                                                          message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        read_config_file(path)
    assert str(path) in str(caught.value)
    assert message in str(caught.value)


@pytest.mark.parametrize(("entry", "message"), [
    ({"enablePrefixCaching": "false"}, 'enablePrefixCaching must be true or false; got "false"'),
    ({"ServerConfig": {"httpsEnabled": "no"}}, 'httpsEnabled must be true or false; got "no"'),
    ({"enforceEager": 0}, "enforceEager must be true or false; got 0"),
    ({"ModelDeployConfig": {"ModelConfig": [{"modelName": 5}]}},
     "modelName must be a string; got 5"),
    ({"ServerConfig": {"ipAddress": 12345}}, "ipAddress must be a string; got 12345"),
    ({"modelWeightPath": ["a"]}, 'modelWeightPath must be a string; got ["a"]'),
])
def test_a_key_of_the_wrong_type_is_a_config_error_naming_it(tmp_path: Path, entry: dict,
                                                             message: str) -> None:
    """A string "false" must not read as true (nor a number break the server later on)."""
    path = write_config(tmp_path, entry)
    with pytest.raises(ConfigError) as caught:
        read_config_file(path)
    assert str(caught.value) == f"config file {path}: {message}"


@pytest.mark.parametrize("server_config", [
    {"ipAddress": "0.0.0.0"},
    {"ipAddress": "127.0.0.1", "managementIpAddress": "::"},
    {"ipAddress": "0.0.0.0", "allowAllZeroIpListening": False},
])
def test_listening_on_every_interface_needs_allow_all_zero_ip_listening(
        tmp_path: Path, server_config: dict) -> None:
    """As MindIE refuses such a config.json; the error names the key."""
    path = write_config(tmp_path, {"ServerConfig": server_config})
    key = next(key for key, value in server_config.items() if value in ("0.0.0.0", "::"))
    with pytest.raises(ConfigError) as caught:
        read_config_file(path)
    assert str(caught.value) == (f"config file {path}: {key} listens on every interface, "
                                 f"which needs allowAllZeroIpListening set to true")


def test_allow_all_zero_ip_listening_lets_a_file_listen_on_every_interface(
        tmp_path: Path) -> None:
    path = write_config(tmp_path, {"ServerConfig": {"ipAddress": "0.0.0.0",
                                                    "allowAllZeroIpListening": True}})
    assert read_config_file(path) == {"http_host": "0.0.0.0"}


def test_missing_config_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(
            f"cannot read config file {tmp_path / 'absent.json'}")):
        read_config_file(tmp_path / "absent.json")


def test_tls_files_come_from_ca_path_first_ca_file_cert_and_key(tmp_path: Path) -> None:
    settings = read_config_file(write_config(tmp_path, mindie_config(
        tlsCaFile=["root.pem", "other.pem"])))
    assert tls_files_from_settings(settings) == TLSFiles(
        ca_file=tmp_path / "security" / "ca" / "root.pem",
        cert_file=tmp_path / "security" / "certs" / "server.pem",
        key_file=tmp_path / "security" / "keys" / "server.key.pem")


def test_no_tls_settings_means_no_tls_files() -> None:
    assert tls_files_from_settings({"max_seq_len": 10, "https_enabled": True}) is None


@pytest.mark.parametrize(("settings", "message"), [
    ({"tls_cert": "s.pem"}, "missing: tls_ca_file, tls_pk"),
    ({"tls_ca_file": ["ca.pem"], "tls_cert": "s.pem"}, "missing: tls_pk"),
    ({"tls_ca_file": [], "tls_cert": "s.pem", "tls_pk": "k.pem"}, "must name at least one file"),
])
def test_incomplete_tls_settings_are_an_error(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tls_files_from_settings(settings)


def test_without_ca_path_the_ca_file_is_next_to_the_config_file(tmp_path: Path) -> None:
    settings = read_config_file(write_config(tmp_path, mindie_config(tlsCaPath=None)))
    assert tls_files_from_settings(settings).ca_file == tmp_path / "ca.pem"


def test_flags_override_the_config_file(tmp_path: Path) -> None:
    path = write_config(tmp_path, mindie_config())
    engine_config, server_config = configs("--config", str(path), "--model-name", "x",
                                           "--model", "/models/other.gguf", "--device", "cpu",
                                           "--grpc-port", "0", "--insecure")
    assert server_config.model_name == "x"
    assert server_config.grpc_port == 0
    assert engine_config.model == Path("/models/other.gguf")
    assert engine_config.device == "cpu"
    assert (engine_config.max_seq_len, engine_config.max_input_token_len,
            engine_config.max_batch_size, engine_config.max_iter_times,
            engine_config.max_prefill_tokens) == (1024, 512, 16, 256, 4096)


def test_speculation_comes_from_the_flag_or_the_config_file(tmp_path: Path) -> None:
    assert configs("--insecure")[0].num_speculative_tokens == 0
    assert configs("--speculate", "3", "--insecure")[0].num_speculative_tokens == 3
    path = write_config(tmp_path, {"numSpeculativeTokens": 2, "speculativeMaxBatch": 8})
    engine_config = configs("--config", str(path), "--insecure")[0]
    assert (engine_config.num_speculative_tokens, engine_config.speculative_max_batch) == (2, 8)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        configs("--speculate", "-1", "--insecure")


def test_one_requests_share_comes_from_the_flags_or_the_config_file(tmp_path: Path) -> None:
    engine_config = configs("--insecure")[0]
    assert (engine_config.max_best_of, engine_config.slots_per_request()) == (128, 200 // 8)
    engine_config = configs("--max-best-of", "4", "--max-slots-per-request", "2",
                            "--insecure")[0]
    assert (engine_config.max_best_of, engine_config.slots_per_request()) == (4, 2)
    path = write_config(tmp_path, {"maxBestOf": 8, "maxSlotsPerRequest": 3, "maxBatchSize": 3})
    engine_config = configs("--config", str(path), "--insecure")[0]
    assert (engine_config.max_best_of, engine_config.slots_per_request()) == (8, 3)


@pytest.mark.parametrize(("flags", "message"), [
    (("--max-best-of", "129"), "max_best_of must be at most 128"),
    (("--max-best-of", "0"), "max_best_of must be a positive integer"),
    (("--max-slots-per-request", "201"), r"max_slots_per_request \(201\) must not exceed "
                                         r"max_batch_size \(200\)"),
    (("--guided-compile-mib", "32"), "guided_compile_mib must be at least 64"),
    (("--guided-compile-cpu-seconds", "0"), "guided_compile_cpu_seconds must be a positive"),
    (("--guided-cache-mib", "-1"), "guided_cache_mib must be a non-negative"),
])
def test_share_and_compile_bounds_out_of_range_are_refused(flags, message) -> None:
    with pytest.raises(ValueError, match=message):
        configs(*flags, "--insecure")


def test_structured_output_bounds_come_from_the_flags_or_the_config_file(tmp_path: Path) -> None:
    engine_config = configs("--insecure")[0]
    assert engine_config.compile_limits() == CompileLimits(512 * 2**20, 60)
    assert 64 * 2**20 <= engine_config.guided_cache_bytes() <= 2**30
    engine_config = configs("--guided-compile-mib", "100", "--guided-compile-cpu-seconds", "5",
                            "--guided-cache-mib", "10", "--insecure")[0]
    assert engine_config.compile_limits() == CompileLimits(100 * 2**20, 5)
    assert engine_config.guided_cache_bytes() == 10 * 2**20
    path = write_config(tmp_path, {"guidedCompileMiB": 70, "guidedCompileCpuSeconds": 2,
                                   "guidedCacheMiB": 1})
    engine_config = configs("--config", str(path), "--insecure")[0]
    assert engine_config.compile_limits() == CompileLimits(70 * 2**20, 2)
    assert engine_config.guided_cache_bytes() == 2**20


@pytest.mark.parametrize(("flag", "key", "field"), [
    ("--enforce-eager", "enforceEager", "enforce_eager"),
    ("--enable-deterministic-inference", "enableDeterministicInference",
     "enable_deterministic_inference")])
def test_a_switch_comes_from_the_config_file_or_the_flag(tmp_path: Path, flag: str, key: str,
                                                         field: str) -> None:
    assert getattr(configs("--insecure")[0], field) is False
    assert getattr(configs(flag, "--insecure")[0], field) is True
    path = write_config(tmp_path, {key: True})
    assert getattr(configs("--config", str(path), "--insecure")[0], field) is True


def test_quantization_comes_from_the_config_file_or_the_flag(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"quantization": "gguf"})
    assert configs("--config", str(path), "--insecure")[0].quantization == "gguf"
    assert configs("--config", str(path), "--quantization", "int4",
                   "--insecure")[0].quantization == "int4"
    assert configs("--insecure")[0].quantization == "auto"
    with pytest.raises(ValueError,
                       match="quantization must be one of auto, none, int8, int4, gguf"):
        configs("--config", str(write_config(tmp_path, {"quantization": "int3"})), "--insecure")


def test_the_config_file_overrides_the_defaults(tmp_path: Path) -> None:
    engine_config, server_config = configs("--config", str(write_config(tmp_path, mindie_config())),
                                           "--insecure")
    assert server_config.model_name == "y"
    assert engine_config.model == tmp_path / "weights" / "model.gguf"
    assert (server_config.grpc_host, server_config.grpc_port) == ("127.0.0.1", 8001)


def test_insecure_flag_serves_without_tls(tmp_path: Path) -> None:
    _, server_config = configs("--config", str(write_config(tmp_path, mindie_config())),
                               "--insecure")
    assert server_config.tls is None
    assert server_config.is_insecure


def test_https_disabled_in_the_config_file_serves_without_tls(tmp_path: Path) -> None:
    path = write_config(tmp_path, mindie_config(httpsEnabled=False))
    assert configs("--config", str(path))[1].tls is None


def test_tls_files_named_by_the_config_file_are_used(tmp_path: Path, pki: DevPKIPaths) -> None:
    path = write_config(tmp_path, pki_config(pki))
    assert configs("--config", str(path))[1].tls == TLSFiles(
        ca_file=pki.ca_cert, cert_file=pki.server_cert, key_file=pki.server_key)


def test_tls_dir_flag_overrides_the_config_files_tls(tmp_path: Path, pki: DevPKIPaths) -> None:
    path = write_config(tmp_path, mindie_config())  # its TLS files do not exist
    assert configs("--config", str(path), "--tls-dir", str(pki.folder))[1].tls == TLSFiles(
        ca_file=pki.ca_cert, cert_file=pki.server_cert, key_file=pki.server_key)


def test_missing_tls_files_are_reported_before_serving(tmp_path: Path) -> None:
    with pytest.raises(TLSConfigError, match=re.escape(
            f"{tmp_path / 'ca.pem'} does not exist")):
        configs("--tls-dir", str(tmp_path))


def test_cache_dir_defaults_under_xdg_cache_home(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert configs("--insecure")[0].cache_dir == tmp_path / "xdg" / "switchboard"
    assert configs("--insecure", "--cache-dir", "/c")[0].cache_dir == Path("/c")


ERROR_STATUSES = [
    (InvalidRequest("temperature", "bad"), grpc.StatusCode.INVALID_ARGUMENT),
    (PromptTooLong("prompt", "too long"), grpc.StatusCode.INVALID_ARGUMENT),
    (Overloaded("busy"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (NotFound("no such model"), grpc.StatusCode.NOT_FOUND),
    (RequestTimedOut("late"), grpc.StatusCode.DEADLINE_EXCEEDED),
    (EngineDead("stopped"), grpc.StatusCode.UNAVAILABLE),
    (GenerationFailed("boom"), grpc.StatusCode.INTERNAL),
    (EngineError("unclassified"), grpc.StatusCode.INTERNAL),
]


@pytest.mark.parametrize(("error", "status"), ERROR_STATUSES,
                         ids=[type(error).__name__ for error, _ in ERROR_STATUSES])
def test_each_engine_error_maps_to_its_grpc_status(error: EngineError,
                                                   status: grpc.StatusCode) -> None:
    assert status_for(error) is status


def test_the_status_table_covers_every_engine_error_class() -> None:
    defined = {value for value in vars(engine_errors).values()
               if isinstance(value, type) and issubclass(value, EngineError)}
    assert defined == {type(error) for error, _ in ERROR_STATUSES}


def gateway_settings(*args: str) -> GatewayConfig:
    return gateway_config(_parser().parse_args(["gateway", *args]))


def test_the_gateway_defaults_to_mindies_ports_with_mutual_tls_on_every_plane(
        pki: DevPKIPaths) -> None:
    config = gateway_settings("--tls-dir", str(pki.folder))
    assert [(p.plane, p.host, p.port, p.tls_mode) for p in config.planes] == [
        (Plane.BUSINESS, "127.0.0.1", 1025, TLSMode.MUTUAL),
        (Plane.MANAGEMENT, "127.0.0.1", 1026, TLSMode.MUTUAL),
        (Plane.METRICS, "127.0.0.1", 1027, TLSMode.MUTUAL)]
    assert config.plane(Plane.BUSINESS).tls.cert_file == pki.server_cert
    assert config.upstream.target == "127.0.0.1:8001"
    assert config.upstream.tls.cert_file == pki.gateway_cert


def test_gateway_ports_come_from_mindie_keys_then_flags(pki: DevPKIPaths, tmp_path: Path) -> None:
    path = write_config(tmp_path, pki_config(pki, port=2025, managementPort=2026, metricsPort=2026,
                                             grpcIpAddress="127.0.0.1", grpcPort=9001))
    config = gateway_settings("--config", str(path), "--tls-dir", str(pki.folder),
                              "--metrics-port", "2027", "--metrics-tls", "none")
    assert [p.port for p in config.planes] == [2025, 2026, 2027]
    assert config.plane(Plane.METRICS).tls_mode is TLSMode.NONE
    assert config.upstream.target == "127.0.0.1:9001"


def test_the_gateway_takes_a_prefill_decode_role_from_the_start(pki: DevPKIPaths) -> None:
    assert gateway_settings("--tls-dir", str(pki.folder)).role == "none"
    assert gateway_settings("--tls-dir", str(pki.folder), "--role", "prefill").role == "prefill"
    with pytest.raises(SystemExit):
        gateway_settings("--tls-dir", str(pki.folder), "--role", "primary")


def test_the_upstream_from_a_grpc_port_alone_is_on_the_default_host(pki: DevPKIPaths,
                                                                    tmp_path: Path) -> None:
    path = write_config(tmp_path, {"grpcPort": 9002})
    config = gateway_settings("--config", str(path), "--tls-dir", str(pki.folder))
    assert config.upstream.target == "127.0.0.1:9002"


def test_plain_http_is_refused_off_loopback(pki: DevPKIPaths) -> None:
    with pytest.raises(ValueError, match="loopback"):
        gateway_settings("--tls-dir", str(pki.folder), "--http-host", "0.0.0.0",
                         "--business-tls", "none")


def test_the_crl_comes_from_mindies_keys_or_the_flag(tmp_path: Path, pki: DevPKIPaths) -> None:
    ca = CertificateAuthority.from_pem(pki.ca_cert.read_bytes(), pki.ca_key.read_bytes())
    (tmp_path / "crl").mkdir()
    (tmp_path / "crl" / "ca.crl.pem").write_bytes(create_crl(ca, [5]))
    path = write_config(tmp_path, pki_config(pki, tlsCrlPath="crl", tlsCrlFiles=["ca.crl.pem"]))
    assert configs("--config", str(path))[1].tls.crl_file == tmp_path / "crl" / "ca.crl.pem"
    flagged = tmp_path / "flagged.crl.pem"
    flagged.write_bytes(create_crl(ca, [6]))
    tls = configs("--config", str(path), "--tls-crl", str(flagged))[1].tls
    assert tls.crl_file == flagged
    assert tls.load().revocations.revoked == {(ca.certificate.subject, 6)}


@pytest.mark.parametrize(("files", "expected"), [([], None), (["a.pem"], Path("crl/a.pem"))])
def test_a_crl_list_names_one_file_or_none(files: list[str], expected: Path | None) -> None:
    assert crl_file_from_settings({"tls_crl_path": "crl", "tls_crl_files": files}) == expected


def test_a_second_crl_file_is_refused_rather_than_ignored() -> None:
    with pytest.raises(ConfigError, match="tlsCrlFiles: one CRL file .* got 2: a.pem, b.pem"):
        crl_file_from_settings({"tls_crl_files": ["a.pem", "b.pem"]})


def test_the_key_password_comes_from_a_file_or_the_environment_and_is_never_logged(
        tmp_path: Path, pki: DevPKIPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    password_file = tmp_path / "password"
    password_file.write_text("from-file\n")
    tls = configs("--tls-dir", str(pki.folder), "--tls-key-password-file", str(password_file),
                  "--grpc-port", "0")[1].tls
    assert tls.key_password == b"from-file"
    monkeypatch.setenv(KEY_PASSWORD_ENV, "from-env")
    engine_config, server_config = configs("--tls-dir", str(pki.folder), "--grpc-port", "0")
    assert server_config.tls.key_password == b"from-env"
    assert "from-env" not in json.dumps(_describe(engine_config, server_config))


def test_a_gateway_without_its_client_certificate_says_where_it_looked(
        tmp_path: Path, pki: DevPKIPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    """The config file's TLS keys are the planes' (server) certificate; the upstream hop's
    client certificate comes from the TLS folder, which here does not exist."""
    monkeypatch.chdir(tmp_path)
    path = write_config(tmp_path, pki_config(pki))
    with pytest.raises(ConfigError) as caught:
        gateway_settings("--config", str(path))
    assert str(caught.value).startswith(
        "the gateway's client certificate for its calls to the server is the TLS folder's "
        "gateway.pem and gateway.key.pem (--tls-dir, default tls/dev; a config file's TLS keys "
        "are the server's certificate): ")


def test_gateway_limits_come_from_flags_or_maxlinknum(tmp_path: Path, pki: DevPKIPaths) -> None:
    path = write_config(tmp_path, pki_config(pki, maxLinkNum=300))
    args = _parser().parse_args(["gateway", "--config", str(path), "--tls-dir", str(pki.folder),
                                 "--client-timeout", "5", "--max-header-bytes", "8192"])
    config = gateway_config(args)
    assert (config.max_connections, config.client_timeout_s, config.max_header_bytes) == (
        300, 5.0, 8192)


@pytest.mark.parametrize(("capacity", "message"), [
    (50_000, "maxSeqLen 100000 is above the model's context (max_position_embeddings): "
             "8192 tokens in force"),
    (4_000, "maxSeqLen 100000 is above what the KV cache pool holds (kvCacheMiB / "
            "kvCacheBlocks): 4000 tokens in force"),
])
def test_a_limit_above_what_holds_is_logged_with_what_does(caplog: pytest.LogCaptureFixture,
                                                           capacity: int, message: str) -> None:
    """The effective configuration logged at start shows the file's maxSeqLen; what the model
    and the KV pool allow is what holds, and the log says so."""
    with caplog.at_level(logging.WARNING, logger="switchboard.engine.config"):
        limits = EngineLimits.from_config(EngineConfig(max_seq_len=100_000), vocab_size=10,
                                          max_token_bytes=8, max_position_embeddings=8192,
                                          kv_capacity_tokens=capacity)
    assert limits.max_seq_len == min(8192, capacity)
    assert [record.getMessage() for record in caplog.records] == [message]


def test_the_log_level_may_come_before_or_after_the_command() -> None:
    """make run ARGS="--log-level debug" puts it after `run`."""
    assert _parser().parse_args(["run", "--log-level", "debug"]).log_level == "debug"
    assert _parser().parse_args(["--log-level", "warning", "server"]).log_level == "warning"
    assert _parser().parse_args(["gateway"]).log_level == "info"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "example.com"])
def test_plaintext_grpc_off_loopback_is_refused_without_its_explicit_flag(host: str) -> None:
    with pytest.raises(ValueError, match=rf"plaintext gRPC \(--insecure\) is allowed on a "
                                         rf"loopback address only unless "
                                         rf"--allow-insecure-non-loopback is given; got '{host}'"):
        configs("--insecure", "--grpc-host", host)
    server_config = configs("--insecure", "--grpc-host", host,
                            "--allow-insecure-non-loopback")[1]
    assert server_config.is_insecure and server_config.grpc_host == host


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_plaintext_grpc_on_loopback_needs_no_flag(host: str) -> None:
    assert configs("--insecure", "--grpc-host", host)[1].is_insecure


def test_run_checks_the_plaintext_rule_before_loading_the_model(caplog) -> None:
    args = _parser().parse_args(["run", "--insecure", "--grpc-host", "0.0.0.0"])
    assert args.command(args) == 2
    assert "plaintext gRPC (--insecure) is allowed on a loopback address only" in caplog.text


def test_management_identities_are_the_gateways_unless_named(pki: DevPKIPaths) -> None:
    assert configs("--insecure")[1].management_identities == (GATEWAY_IDENTITY,)
    named = configs("--insecure", "--management-identity", "ops",
                    "--management-identity", "ci")[1]
    assert named.management_identities == ("ops", "ci")
    args = _parser().parse_args(["run", "--management-identity", "ops",
                                 "--management-identity", "ci"])
    assert _flags_given(args, args.server_options) == ["--management-identity=ops",
                                                       "--management-identity=ci"]
